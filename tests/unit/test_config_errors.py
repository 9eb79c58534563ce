"""Every malformed configuration input stops the CLI with exit 1 and one line per problem naming
the key (or the variable), never a traceback; nothing is silently ignored; `config show` shows no
secret. Driven through the real command line."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from typer.testing import CliRunner

from tests.waiting import run_process
from tributary.api.cli.main import app
from tributary.api.settings.config import LogSettings, Settings, load_settings
from tributary.api.settings.environment import NOT_SETTINGS, model_of, setting_names, union_members
from tributary.log.local import Log

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ./tributary.toml and no TRIBUTARY_* settings but the test's own."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.upper().startswith("TRIBUTARY_"):
            monkeypatch.delenv(name)


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "tributary.toml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _fails(args: list[str], env: dict[str, str] | None = None) -> list[str]:
    """Run the CLI expecting a config error: exit 1, no traceback; the lines on stderr."""
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("tributary: config error") for line in lines), lines
    return lines


def _show(args: list[str] | None = None, env: dict[str, str] | None = None) -> dict[str, object]:
    result = CliRunner().invoke(app, ["config", "show", *(args or [])], env=env)
    assert result.exit_code == 0, (result.output, result.exception)
    data: dict[str, object] = json.loads(result.stdout)
    return data


# -- the file ------------------------------------------------------------------------------------


def test_non_utf8_file_names_the_line_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, b'[log]\npartitions = 4\n\n[[sources]]\nname = "caf\xe9"\ndsn = "x"\n')
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: line 5, [[sources]] name: not UTF-8 text (byte 0xe9); "
        "save the file as UTF-8"
    ]


def test_a_toml_syntax_error_names_the_line_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "[log]\npartitions = 4\nlinger_ms = five\n")
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: line 3, [log] linger_ms: invalid value (column 13)"
    ]


def test_a_byte_order_mark_is_not_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, b"\xef\xbb\xbf[log]\npartitions = 8\n")
    assert _show(["-c", str(path)])["log"]["partitions"] == 8  # type: ignore[index]


def test_several_mistakes_show_every_one_in_the_users_words(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[[sources]]\nnmae = "shop"\ndsn = "postgresql://u@h/shop"\n\n'
        '[api]\nport = "abc"\nkeys = [{ key = "k1", scope = ["read"] }]\n\n'
        "[lgo]\npartitions = 2\n",
    )
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: unknown key 'nmae' in [[sources]] — did you mean 'name'?",
        f"tributary: config error in {path}: unknown key 'scope' in [api] keys #1 — did you mean 'scopes'?",
        f"tributary: config error in {path}: unknown section [lgo] — did you mean [log]?",
        f"tributary: config error in {path}: [api] port: expected an integer, got 'abc'",
    ]


def test_misspelt_sections_suggest_the_header_as_written(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[sorces]]\nname = "a"\n\n[servce]\ndsn = "x"\n')
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: unknown section [[sorces]] — did you mean [[sources]]?",
        f"tributary: config error in {path}: unknown section [servce] — did you mean [service]?",
    ]


def test_a_key_outside_its_section_says_where_it_belongs(tmp_path: Path) -> None:
    path = _write(tmp_path, "linger_ms = 1\n")
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: unknown key 'linger_ms' at the top level — it belongs in [log]"
    ]


def test_which_of_several_sources_is_named(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[[sources]]\nname = "a"\ndsn = "host=a"\n\n[[sources]]\nname = "b"\n\n[[sources]]\nname = "c"\ndsn = "host=c"\n'
        'snapshot = "sometimes"\n',
    )
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: [[sources]] #2: missing required key 'dsn'",
        f"tributary: config error in {path}: [[sources]] #3 snapshot: expected 'initial', 'initial_only', "
        "'no_data', 'always', 'when_needed' or 'never', got 'sometimes'",
    ]


def test_resnapshot_on_rewrite_is_a_boolean(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[sources]]\nname = "a"\ndsn = "host=a"\nresnapshot_on_rewrite = "sometimes"\n')
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: [[sources]] resnapshot_on_rewrite: expected true or false, got 'sometimes'"
    ]


def test_envelope_is_tributary_or_debezium(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[sources]]\nname = "a"\ndsn = "host=a"\nenvelope = "kafka-connect"\n')
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: [[sources]] envelope: expected 'tributary' or 'debezium', got 'kafka-connect'"
    ]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (
            'transaction_metadata = "sometimes"',
            "[[sources]] transaction_metadata: expected true or false, got 'sometimes'",
        ),
        (
            "heartbeat_interval_ms = -1",
            "[[sources]] heartbeat_interval_ms: must be between 0 and 3153600000000, got -1",
        ),
        (
            'notification_channels = ["kafka"]',
            "[[sources]] notification_channels #1: expected 'sink' or 'log', got 'kafka'",
        ),
    ],
)
def test_transaction_heartbeat_and_notification_keys_are_checked(tmp_path: Path, line: str, error: str) -> None:
    path = _write(tmp_path, f'[[sources]]\nname = "a"\ndsn = "host=a"\n{line}\n')
    assert _fails(["config", "show", "-c", str(path)]) == [f"tributary: config error in {path}: {error}"]


# -- values that would only crash later ----------------------------------------------------------


def test_segment_bytes_is_bounded_by_what_the_log_accepts(tmp_path: Path) -> None:
    path = _write(tmp_path, "[log]\nsegment_bytes = 4294967296\n")
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: [log] segment_bytes: must be between 4096 and 4294967295, got 4294967296"
    ]
    # the bound is the log's own: it opens with the largest accepted value and refuses one more
    largest = load_settings(_write(tmp_path, "[log]\nsegment_bytes = 4294967295\n")).log.segment_bytes
    Log.open(tmp_path / "log", writer=True, segment_bytes=largest).close()
    with pytest.raises(ValueError):
        Log.open(tmp_path / "log2", writer=True, segment_bytes=largest + 1)


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("inf", "expected a finite number, got inf"),
        ("nan", "expected a finite number, got nan"),
        ("-1.0", "must be between 0 and 86400, got -1.0"),
        ("1e300", "must be between 0 and 86400, got 1e+300"),
    ],
)
def test_cleaner_interval_must_be_a_sane_finite_number(tmp_path: Path, value: str, what: str) -> None:
    path = _write(tmp_path, f"[log]\ncleaner_interval_s = {value}\n")
    assert _fails(["config", "show", "-c", str(path)]) == [
        f"tributary: config error in {path}: [log] cleaner_interval_s: {what}"
    ]


def test_infinity_from_the_environment_is_refused_too() -> None:
    assert _fails(["config", "show"], env={"TRIBUTARY_CAPTURE__MAX_BACKOFF_S": "inf"}) == [
        "tributary: config error in TRIBUTARY_CAPTURE__MAX_BACKOFF_S: [capture] max_backoff_s: "
        "expected a finite number, got 'inf'"
    ]


def _numeric_fields() -> list[tuple[str, str, FieldInfo]]:
    """(section, key, field) of every int or float key, [[sources]] included."""
    out = []
    for section_name, section in Settings.model_fields.items():
        items = [a for a in get_args(section.annotation) if a is not Ellipsis]
        model = model_of(section.annotation) or (model_of(items[0]) if items else None)
        for name, info in (model.model_fields if model is not None else {}).items():
            kinds = set(union_members(info.annotation))
            if kinds & {int, float} and bool not in kinds:
                out.append((section_name, name, info))
    return out


def test_every_numeric_key_has_a_lower_and_an_upper_bound() -> None:
    fields = _numeric_fields()
    assert {("log", "segment_bytes"), ("sources", "partitions"), ("api", "port")} <= {(s, n) for s, n, _ in fields}
    unbounded = []
    for section, name, info in fields:
        limits = {k for m in info.metadata for k in ("ge", "gt", "le", "lt") if getattr(m, k, None) is not None}
        if not (limits & {"ge", "gt"} and limits & {"le", "lt"}):
            unbounded.append(f"[{section}] {name}")
    assert unbounded == []
    # and no float key takes inf or nan (tested through the CLI above for one of them)
    assert all(model.model_config.get("allow_inf_nan") is False for model in _sections())


def _sections() -> list[type[BaseModel]]:
    found = []
    for section in Settings.model_fields.values():
        items = [a for a in get_args(section.annotation) if a is not Ellipsis]
        model = model_of(section.annotation) or (model_of(items[0]) if items else None)
        if model is not None:
            found.append(model)
    return found


# -- API keys ------------------------------------------------------------------------------------


def test_an_empty_api_key_is_refused_and_cannot_open_the_bind(tmp_path: Path) -> None:
    path = _write(tmp_path, '[api]\nkeys = [{ key = "", scopes = ["admin"] }]\n')
    line = f"tributary: config error in {path}: [api] keys #1 key: must not be empty"
    assert _fails(["config", "show", "-c", str(path)]) == [line]
    # the bind that an empty key used to unlock
    assert _fails(["serve", "-c", str(path), "--host", "0.0.0.0"]) == [line]


def test_a_key_with_spaces_is_refused_from_the_environment() -> None:
    env = {"TRIBUTARY_API__KEYS": '[{"key": " abc ", "scopes": ["read"]}]'}
    assert _fails(["config", "show"], env=env) == [
        "tributary: config error in TRIBUTARY_API__KEYS: [api] keys #1 key: must be printable ASCII without "
        "spaces (it is sent in an HTTP header)"
    ]


# -- the environment -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["TRIBUTARY_SOURCES", "TRIBUTARY_API__KEYS"])
def test_bad_json_in_the_environment_is_one_line_naming_the_variable(name: str) -> None:
    lines = _fails(["config", "show"], env={name: '[{"name": "shop",'})
    assert len(lines) == 1
    assert lines[0].startswith(f"tributary: config error in {name}: not valid JSON (")
    assert lines[0].endswith("; set it to a JSON array")


def test_unknown_variables_are_errors_with_did_you_mean() -> None:
    env = {"TRIBUTARY_NOPE__X": "1", "TRIBUTARY_LOG__PARTITONS": "8", "TRIBUTARY_LOG_ROOT": "/x"}
    assert _fails(["config", "show"], env=env) == [
        "tributary: config error: unknown setting TRIBUTARY_LOG_ROOT — did you mean TRIBUTARY_LOG__ROOT?",
        "tributary: config error: unknown setting TRIBUTARY_LOG__PARTITONS — did you mean TRIBUTARY_LOG__PARTITIONS?",
        "tributary: config error: unknown setting TRIBUTARY_NOPE__X (settings are TRIBUTARY_<SECTION>__<KEY>; "
        "`tributary config reference` lists the keys)",
    ]


def test_errors_from_the_environment_name_the_variable_and_file_errors_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, '[log]\nlinger_ms = "soon"\n')
    env = {"TRIBUTARY_API__PORT": "abc", "TRIBUTARY_LOG": '{"partitions": 0}'}
    assert _fails(["config", "show", "-c", str(path)], env=env) == [
        "tributary: config error in TRIBUTARY_LOG: [log] partitions: must be between 1 and 1024, got 0",
        f"tributary: config error in {path}: [log] linger_ms: expected an integer, got 'soon'",
        "tributary: config error in TRIBUTARY_API__PORT: [api] port: expected an integer, got 'abc'",
    ]


def test_a_section_variable_that_is_not_an_object_is_not_dropped() -> None:
    env = {"TRIBUTARY_LOG": "[1]", "TRIBUTARY_LOG__ROOT": "/data/log"}
    assert _fails(["config", "show"], env=env) == [
        "tributary: config error in TRIBUTARY_LOG: [log]: expected a table, got an array"
    ]


def test_the_environment_overrides_the_file_key_by_key(tmp_path: Path) -> None:
    path = _write(tmp_path, '[log]\npartitions = 2\nlinger_ms = 7\n\n[[sources]]\nname = "a"\ndsn = "x"\n')
    env = {
        "TRIBUTARY_LOG": '{"root": "/data/log", "linger_ms": 9}',
        "tributary_log__linger_ms": "1",  # names are case-insensitive; a single key beats its section's JSON
        "TRIBUTARY_SOURCES": '[{"name": "shop", "dsn": "postgresql://h/shop"}]',
        "TRIBUTARY_PURE_PYTHON": "1",  # read by the typed code, not a setting: allowed
        "TRIBUTARY_IMPL": "python",  # the same switch, its current name
        "TRIBUTARY_TEST_PG": "embedded",
    }
    data = _show(["-c", str(path)], env=env)
    assert data["log"] == {**data["log"], "root": "/data/log", "partitions": 2, "linger_ms": 1}  # type: ignore[dict-item]
    assert [s["name"] for s in data["sources"]] == ["shop"]  # type: ignore[attr-defined]


def test_config_reference_is_the_built_in_defaults_whatever_the_environment() -> None:
    result = CliRunner().invoke(app, ["config", "reference"], env={"TRIBUTARY_LOG__PARTITIONS": "8"})
    assert result.exit_code == 0 and "\npartitions = 4 " in result.stdout


# -- config show ---------------------------------------------------------------------------------


def test_config_show_masks_api_keys_and_every_password(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "[service]\ndsn = \"host=db password='it is \\\\'quoted\\\\'' dbname=svc\"\n\n"
        '[api]\nkeys = [{ key = "s3cr3t-admin", scopes = ["admin"] }, { key = "s3cr3t-read" }]\n\n'
        '[[sources]]\nname = "a"\ndsn = "postgresql://:nouser@h/db?sslmode=require&password=inquery"\n\n'
        '[[sources]]\nname = "b"\ndsn = "postgresql://u:p%40ss@h1:5432,h2:5433/db"\n',
    )
    result = CliRunner().invoke(app, ["config", "show", "-c", str(path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # still valid JSON whatever the passwords hold
    for secret in ("s3cr3t", "quoted", "nouser", "inquery", "p%40ss"):
        assert secret not in result.stdout
    assert [k["key"] for k in data["api"]["keys"]] == ["***", "***"]
    assert data["service"]["dsn"] == "host=db password=*** dbname=svc"
    assert [s["dsn"] for s in data["sources"]] == [
        "postgresql://:***@h/db?sslmode=require&password=***",
        "postgresql://u:***@h1:5432,h2:5433/db",
    ]


def test_config_show_masks_sink_headers_and_url_passwords(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[[sinks]]\ntype = "http"\nname = "hook"\nurl = "https://u:hunter2@example.com/in"\ntopics = ["t"]\n'
        'headers = { Authorization = "Bearer t0ken", X-Trace = "1" }\n',
    )
    result = CliRunner().invoke(app, ["config", "show", "-c", str(path)])
    assert result.exit_code == 0, result.output
    assert "t0ken" not in result.stdout and "hunter2" not in result.stdout
    sink = json.loads(result.stdout)["sinks"][0]
    assert sink["headers"] == {"Authorization": "***", "X-Trace": "***"}
    assert sink["url"] == "https://u:***@example.com/in"


@pytest.mark.parametrize(
    ("sink", "problem"),
    [
        ('type = "kafka"', "type"),
        ('url = "ftp://x"', "url"),
        ("topics = []", "topics"),
        ("max_attempts = 0", "max_attempts"),
    ],
)
def test_a_bad_sink_names_its_key(tmp_path: Path, sink: str, problem: str) -> None:
    base = {"type": '"http"', "name": '"hook"', "url": '"http://127.0.0.1:9/in"', "topics": '["t"]'}
    key = sink.split(" = ")[0]
    lines = [f"{k} = {v}" for k, v in base.items() if k != key] + [sink]
    path = _write(tmp_path, "[[sinks]]\n" + "\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["config", "show", "-c", str(path)])
    assert result.exit_code == 1
    assert "sinks" in result.output and problem in result.output


# -- the installed command -----------------------------------------------------------------------


def test_the_real_command_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TRIBUTARY_")}
    env["TRIBUTARY_SOURCES"] = "[{"
    proc = run_process(
        [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "config", "show"],
        what="tributary config show",
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "tributary: config error in TRIBUTARY_SOURCES: not valid JSON (Expecting property name enclosed in "
        "double quotes: line 1 column 3 (char 2)); set it to a JSON array"
    ]


def test_every_tributary_variable_the_project_names_is_accepted() -> None:
    """A `TRIBUTARY_*` name the code, the deploy files or the docs use must be a setting or one of
    NOT_SETTINGS; otherwise the CLI would refuse an environment that follows the project's own docs."""
    root = Path(__file__).resolve().parents[2]
    files = [root / "README.md", *root.glob("docs/*.md"), *root.glob("deploy/**/*")]
    for folder in ("api", "capture", "eventstore", "projections", "migrations"):
        files += root.glob(f"{folder}/**/*.py")
    used = {
        name
        for path in files
        if path.is_file()
        for name in re.findall(r"\bTRIBUTARY_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace"))
    }
    assert {"TRIBUTARY_PURE_PYTHON", "TRIBUTARY_SERVICE__DSN", "TRIBUTARY_SOURCES"} <= used  # the scan found them
    # deploy/compose.yaml runs capture on the Kafka log backend; its keys are settings once that
    # backend is part of the build (until then, these two and only these are allowed ahead of it)
    ahead = set() if "backend" in LogSettings.model_fields else {"TRIBUTARY_LOG__BACKEND", "TRIBUTARY_LOG__KAFKA"}
    names = set(setting_names(Settings))
    from_files = {n for n in used if n.endswith("_FILE") and n.removesuffix("_FILE") in names}  # a setting's file
    assert sorted(used - names - NOT_SETTINGS - ahead - from_files) == []


def test_settings_read_from_files_named_by_file_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose and Kubernetes secrets are files: `TRIBUTARY_<NAME>_FILE` reads `TRIBUTARY_<NAME>` from one."""
    dsn, sources = tmp_path / "service_dsn", tmp_path / "sources.json"
    dsn.write_text("postgresql://tributary_service:s3cret@db:5432/tributary\n")  # as `echo … >` writes it
    sources.write_text('[{"name": "shop", "dsn": "postgresql://tributary_capture:pw@db/shop"}]')
    monkeypatch.setenv("TRIBUTARY_SERVICE__DSN_FILE", str(dsn))
    monkeypatch.setenv("TRIBUTARY_SOURCES_FILE", str(sources))
    settings = load_settings()
    assert settings.service.dsn == "postgresql://tributary_service:s3cret@db:5432/tributary"
    assert [s.dsn for s in settings.sources] == ["postgresql://tributary_capture:pw@db/shop"]


def test_file_variables_fail_in_one_line_each(tmp_path: Path) -> None:
    env = {
        "TRIBUTARY_SERVICE__DSN_FILE": str(tmp_path / "missing"),
        "TRIBUTARY_API__KEYS": "[]",
        "TRIBUTARY_API__KEYS_FILE": str(tmp_path / "missing"),
        "TRIBUTARY_NOPE_FILE": "/x",
    }
    assert _fails(["config", "show"], env=env) == [
        "tributary: config error: both TRIBUTARY_API__KEYS and TRIBUTARY_API__KEYS_FILE are set: set one",
        f"tributary: config error in TRIBUTARY_SERVICE__DSN_FILE: cannot read {tmp_path / 'missing'}: "
        "No such file or directory",
        "tributary: config error: unknown setting TRIBUTARY_NOPE_FILE (settings are TRIBUTARY_<SECTION>__<KEY>; "
        "`tributary config reference` lists the keys)",
    ]
