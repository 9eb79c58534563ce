"""The `TRIBUTARY_*` environment as settings data: `TRIBUTARY_<SECTION>__<KEY>` sets one key,
`TRIBUTARY_<KEY>` a top-level key or a whole section; lists and tables are given as JSON.

Every `TRIBUTARY_` name must be a setting (or one of the few other names the project reads), so a
typo stops the program instead of being ignored; names are matched case-insensitively."""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union, get_args, get_origin

from pydantic import BaseModel

from tributary.jsonvalue import JsonObject, JsonValue

__all__ = [
    "ENV_PREFIX",
    "NOT_SETTINGS",
    "FILE_SUFFIX",
    "EnvironmentData",
    "model_of",
    "read_environment",
    "setting_names",
    "union_members",
]

ENV_PREFIX = "TRIBUTARY_"

# `TRIBUTARY_` names that are not settings: the switch between compiled and pure-Python code
# (`tributary.impl`, and its older spelling), the test suite's server choices, and the variables
# deploy/compose.yaml substitutes (a shell that runs compose has them exported).
NOT_SETTINGS = frozenset(
    {
        "TRIBUTARY_IMPL",
        "TRIBUTARY_PURE_PYTHON",
        "TRIBUTARY_TEST_PG",
        "TRIBUTARY_TEST_KAFKA",
        "TRIBUTARY_API_KEY",
        "TRIBUTARY_IMAGE",
    }
)

Path_ = tuple[str, ...]

# `TRIBUTARY_<NAME>_FILE=/run/secrets/x`: the setting `TRIBUTARY_<NAME>` read from that file, so a
# secret (a DSN with its password, API keys) mounted as a file never sits in the environment.
FILE_SUFFIX = "_FILE"


@dataclass
class EnvironmentData:
    """What the environment sets (nested like the TOML), which variable set each path, and the
    problems found (one line each)."""

    data: JsonObject = field(default_factory=dict)
    provenance: dict[Path_, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def union_members(annotation: object) -> tuple[object, ...]:
    """The types of a union (`X | None`), or the type itself."""
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def model_of(annotation: object) -> type[BaseModel] | None:
    """The settings model an annotation holds (a section, or `X | None` of one), else None."""
    for member in union_members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _is_json(annotation: object) -> bool:
    """Tables and lists come as JSON; scalars as the plain string, which pydantic converts."""
    for member in union_members(annotation):
        if model_of(member) is not None or get_origin(member) in (tuple, list, dict, set, frozenset):
            return True
    return False


def setting_names(model: type[BaseModel]) -> dict[str, tuple[Path_, object]]:
    """Every accepted variable name (upper case) → (its path in the settings, its annotation)."""
    names: dict[str, tuple[Path_, object]] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        names[f"{ENV_PREFIX}{key.upper()}"] = ((key,), info.annotation)
        section = info.annotation
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            continue  # a scalar or a list: set whole
        for sub_name, sub in section.model_fields.items():
            sub_key = sub.alias or sub_name
            names[f"{ENV_PREFIX}{key.upper()}__{sub_key.upper()}"] = ((key, sub_key), sub.annotation)
            table = sub.annotation
            if isinstance(table, type) and issubclass(table, BaseModel):  # a sub-table: `[log.kafka]`
                for leaf_name, leaf in table.model_fields.items():
                    leaf_key = leaf.alias or leaf_name
                    var = f"{ENV_PREFIX}{key.upper()}__{sub_key.upper()}__{leaf_key.upper()}"
                    names[var] = ((key, sub_key, leaf_key), leaf.annotation)
    return names


def _unknown(name: str, known: list[str]) -> str:
    short = name.upper().removeprefix(ENV_PREFIX)
    close = difflib.get_close_matches(short, [k.removeprefix(ENV_PREFIX) for k in known], n=1)
    hint = (
        f" — did you mean {ENV_PREFIX}{close[0]}?"
        if close
        else f" (settings are {ENV_PREFIX}<SECTION>__<KEY>; `tributary config reference` lists the keys)"
    )
    return f"config error: unknown setting {name}{hint}"


def _json_kind(annotation: object) -> str:
    return "a JSON object" if isinstance(annotation, type) and issubclass(annotation, BaseModel) else "a JSON array"


def _put(env: EnvironmentData, path: Path_, value: JsonValue, name: str) -> None:
    """Set `path` to `value`; remember `name` for each key a section's JSON object sets, so an
    error in a key the file set is not blamed on the variable."""
    if len(path) >= 2:
        section = env.data.setdefault(path[0], {})
        for part in path[1:-1]:  # a sub-table's key: `[log.kafka]`
            section = section.setdefault(part, {}) if isinstance(section, dict) else None
        if isinstance(section, dict):  # else the section's variable is not a JSON object: reported then
            section[path[-1]] = value
            env.provenance[path] = name
    elif isinstance(value, dict):
        env.data[path[0]] = value
        env.provenance.update({(path[0], str(key)): name for key in value})
    else:
        env.data[path[0]] = value
        env.provenance[path] = name


def read_environment(model: type[BaseModel], environ: Mapping[str, str]) -> EnvironmentData:
    """The settings that `environ` sets for `model`, with a problem line for every unknown
    `TRIBUTARY_` name and every value that is not the JSON its key needs."""
    names = setting_names(model)
    env = EnvironmentData()
    ours = [n for n in environ if n.upper().startswith(ENV_PREFIX) and n.upper() not in NOT_SETTINGS]
    values = {n: environ[n] for n in ours if not _file_of(n, names)}
    values.update(_read_files({n: environ[n] for n in ours if _file_of(n, names)}, values, env.problems))
    # A whole section first, then single keys on top of it.
    for name in sorted(values, key=lambda n: (n.upper().count("__"), n.upper())):
        known = names.get(name.upper().removesuffix(FILE_SUFFIX) if _file_of(name, names) else name.upper())
        if known is None:
            env.problems.append(_unknown(name, sorted(names)))
            continue
        path, annotation = known
        raw = values[name]
        if not _is_json(annotation):
            _put(env, path, raw, name)
            continue
        try:
            value = json.loads(raw)
        except ValueError as exc:
            env.problems.append(f"config error in {name}: not valid JSON ({exc}); set it to {_json_kind(annotation)}")
            continue
        _put(env, path, value, name)
    return env


def _file_of(name: str, names: Mapping[str, object]) -> bool:
    """`name` is `<setting>_FILE` (and not itself a setting)."""
    upper = name.upper()
    return upper.endswith(FILE_SUFFIX) and upper not in names and upper.removesuffix(FILE_SUFFIX) in names


def _read_files(files: Mapping[str, str], direct: Mapping[str, str], problems: list[str]) -> dict[str, str]:
    """Each `<setting>_FILE` variable → the file's text (one trailing newline dropped), under the
    variable's own name; a problem line when the file cannot be read or the setting is set too."""
    out: dict[str, str] = {}
    given = {n.upper() for n in direct}
    for name, path in sorted(files.items()):
        setting = name.upper().removesuffix(FILE_SUFFIX)
        if setting in given:
            problems.append(f"config error: both {setting} and {name} are set: set one")
            continue
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"config error in {name}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}")
            continue
        out[name] = text.removesuffix("\n").removesuffix("\r")
    return out
