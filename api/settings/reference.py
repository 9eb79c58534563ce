"""The configuration reference, generated from the settings model (README's block is checked
against it by a test, so the two cannot drift)."""

from __future__ import annotations

import json

from pydantic import BaseModel

from tributary.api.settings.config import (
    OutboxTableSettings,
    RouteSettings,
    RuleSettings,
    Settings,
    SinkSettings,
    SourceSettings,
)

__all__ = ["reference"]


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + " }" if value else "{}"
        )
    if value is None:
        return '""'
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _section(model: type[BaseModel], defaults: BaseModel | None, examples: dict[str, str] | None = None) -> list[str]:
    lines = []
    subsections: list[str] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        default = getattr(defaults, name) if defaults is not None else field.default
        if isinstance(default, BaseModel):  # a sub-table (`[log.kafka]`), after the section's keys
            subsections += ["", f"[{{section}}.{key}]", *_section(type(default), default)]
            continue
        if key == "keys":
            lines.append(
                '# keys = [{ key = "…", scopes = ["read", "write", "admin"] }]   # ' + (field.description or "")
            )
            continue
        if field.is_required():
            example = (examples or {}).get(key) or {
                "name": '"shop"',
                "dsn": '"postgresql://user@127.0.0.1:5432/shop"',
                "type": '"http"',
                "url": '"http://127.0.0.1:9000/ingest"',
                "topics": '["shop.public.orders"]',
            }.get(key, '"…"')
            line = f"{key} = {example}"
        elif default is None:
            line = f"# {key} ="  # unset by default
        else:
            line = f"{key} = {_toml(default)}"
        lines.append(line.ljust(43) + f" # {field.description or ''}".rstrip())
    return lines + subsections


def reference() -> str:
    """Every key with its default and meaning, as TOML."""
    settings = Settings()
    out = [_section_top(settings)]
    for name in Settings.model_fields:
        if name in ("sources", "sinks", "pg_data_dir"):
            continue
        out.append(f"[{name}]")
        section = getattr(settings, name)
        assert isinstance(section, BaseModel), name  # every other field of Settings is a section
        lines = _section(type(section), section)
        out.extend(
            line.replace("[{section}.", f"[{name}.", 1) if line.startswith("[{section}.") else line for line in lines
        )
        out.append("")
    out.append("[[sources]]".ljust(43) + " # one per captured database (repeat the table)")
    out.extend(
        line for line in _section(SourceSettings, None) if not line.startswith(("rules =", "outbox =", "routes ="))
    )
    out.append("")
    # Commented out: rules name the user's own tables and columns.
    out.append("# [[sources.rules]]".ljust(43) + " # column and row rules per table (repeat the table)")
    rules = _section(RuleSettings, None, {"tables": '["public.customers"]'})
    out.extend(line if line.startswith("#") else "# " + line for line in rules)
    out.append("")
    # Commented out: an outbox table is the user's own (docs/capture.md, "Outbox tables").
    out.append("# [[sources.outbox]]".ljust(43) + " # one per outbox table of your services (repeat the table)")
    out.extend(
        line if line.startswith("#") else "# " + line
        for line in _section(OutboxTableSettings, None, {"table": '"public.outbox"'})
    )
    # Commented out: which tables share a topic is the user's choice (docs/capture.md, "Routing tables").
    out.append("# [[sources.routes]]".ljust(43) + " # one per route of tables into one topic (repeat the table)")
    out.extend(
        line if line.startswith("#") else "# " + line
        for line in _section(RouteSettings, None, {"tables": '"public.shard_*"', "topic": '"{source}.orders"'})
    )
    out.append("")
    # Commented out: a sink needs a real URL, and none runs unless configured.
    out.append("# [[sinks]]".ljust(43) + " # one per sink, run by `tributary sinks run` (repeat the table)")
    out.extend(
        line if line.startswith("#") else "# " + line for line in _section(SinkSettings, None, {"name": '"webhook"'})
    )
    return "\n".join(out).rstrip() + "\n"


def _section_top(settings: Settings) -> str:
    field = Settings.model_fields["pg_data_dir"]
    return f"pg_data_dir = {_toml(settings.pg_data_dir)}".ljust(43) + f" # {field.description}\n"
