"""`[eventstore] modules`: domain files and modules load, and a broken one stops `init` and `serve`
with one line naming the file and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.capture.helpers import cli
from tributary.api.settings.config import load_settings
from tributary.eventstore.errors import AggregateDefinitionError
from tributary.eventstore.loader import load_aggregates

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
TALLY = (ROOT / "tests" / "domains" / "tally.py").read_text()

HEAD = """
from pydantic import BaseModel
from tributary.eventstore.aggregate import Aggregate

class Go(BaseModel):
    pass

class Went(BaseModel):
    pass

class S(BaseModel):
    n: int = 0

def decide(state, command):
    return [Went()]

def evolve(state, event):
    return state
"""


def agg(stream_type: str = "walk", **extra: str) -> str:
    fields = {
        "stream_type": repr(stream_type),
        "state_type": "S",
        "commands": '{"go": Go}',
        "events": "[Went]",
        "decide": "decide",
        "evolve": "evolve",
        **extra,
    }
    return "\nAGGREGATE = Aggregate(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")\n"


BROKEN = {
    "syntax": (HEAD + "def oops(:\n    pass\n" + agg(), "line 19: SyntaxError: invalid syntax"),
    "missing function": (
        HEAD.replace("def evolve(state, event):\n    return state\n", "") + agg(),
        "line 18: NameError: name 'evolve' is not defined",
    ),
    "no export": (HEAD, "exports no AGGREGATE (an Aggregate) or AGGREGATES"),
    "not an aggregate": (
        HEAD + "AGGREGATE = decide\n",
        "must be tributary.eventstore.aggregate.Aggregate, not function",
    ),
    "event without model": (
        HEAD + agg(event_versions='{"Gone": 2}'),
        "event_versions names 'Gone', which has no model among the events",
    ),
    "bad state version": (HEAD + agg(state_version="0"), "state_version must be an integer ≥ 1, not 0"),
    "raises": (HEAD + "raise RuntimeError('no config\\nsecond line')\n", "line 19: RuntimeError: no config"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_module_is_one_line_naming_file_and_problem(tmp_path: Path, case: str) -> None:
    source, words = BROKEN[case]
    module = tmp_path / "walk.py"
    module.write_text(source)
    with pytest.raises(AggregateDefinitionError) as refused:
        load_aggregates([str(module)])
    message = str(refused.value)
    assert message.startswith(f"{module}: ") and words in message and "\n" not in message, message


def test_a_stream_type_defined_twice_names_both_modules(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(TALLY)
    with pytest.raises(AggregateDefinitionError) as refused:
        load_aggregates([str(tmp_path / "a.py"), "tests.domains.tally"])
    assert str(refused.value) == f"tests.domains.tally: stream type 'tally' is already defined by {tmp_path / 'a.py'}"


def test_missing_files_and_modules_are_named(tmp_path: Path) -> None:
    with pytest.raises(AggregateDefinitionError, match=r"\[eventstore\] modules: no file 'nowhere/x.py'"):
        load_aggregates(["nowhere/x.py"])
    with pytest.raises(AggregateDefinitionError, match=r"\[eventstore\] modules: no module 'no_such_domain.orders'"):
        load_aggregates(["no_such_domain.orders"])


def test_files_load_relative_to_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "conf" / "domain").mkdir(parents=True)
    (tmp_path / "conf" / "domain" / "tally.py").write_text(TALLY)
    (tmp_path / "domain").mkdir()
    (tmp_path / "domain" / "tally.py").write_text("raise SystemExit('the working directory was used')\n")
    monkeypatch.chdir(tmp_path)
    config = Path("conf") / "t.toml"
    config.write_text('[eventstore]\nmodules = ["domain/tally.py", "tributary.eventstore.examples.bank"]\n')
    settings = load_settings(config)
    assert settings.eventstore.modules == (
        str((tmp_path / "conf/domain/tally.py").resolve()),
        "tributary.eventstore.examples.bank",
    )
    assert sorted(load_aggregates(settings.eventstore.modules)) == ["account", "tally"]


@pytest.mark.parametrize("command", [["init"], ["serve", "--port", "0"]])
def test_init_and_serve_stop_on_a_broken_module(tmp_path: Path, command: list[str]) -> None:
    source, words = BROKEN["event without model"]
    (tmp_path / "walk.py").write_text(source)
    config = tmp_path / "t.toml"
    config.write_text('[service]\ndsn = "postgresql://127.0.0.1:1/unreachable"\n[eventstore]\nmodules = ["walk.py"]\n')
    run = cli(*command, "--config", str(config), timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines == [f"tributary: {tmp_path / 'walk.py'}: line 20: aggregate 'walk': " + words], run.stderr


def test_init_names_the_stream_types_or_says_there_are_none(fresh_db: str, tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text(f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n')
    none = cli("init", "--config", str(config))
    assert none.returncode == 0, none.stdout + none.stderr
    assert "no [eventstore] modules configured: the API serves no command types" in none.stdout
    config.write_text(config.read_text() + '[eventstore]\nmodules = ["tests.domains.tally"]\n')
    some = cli("init", "--config", str(config))
    assert some.returncode == 0, some.stdout + some.stderr
    assert "event store: stream type tally (commands: add, close)" in some.stdout


def test_a_domain_file_imports_a_file_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The models in `walk_models_beside.py`, the aggregate in `walk.py` importing them; the config
    names the file relative to itself and the working directory is elsewhere."""
    (tmp_path / "conf" / "domain").mkdir(parents=True)
    models, rest = HEAD.split("def decide", 1)
    (tmp_path / "conf" / "domain" / "walk_models_beside.py").write_text(models)
    (tmp_path / "conf" / "domain" / "walk.py").write_text(
        "from pydantic import BaseModel\nfrom tributary.eventstore.aggregate import Aggregate\n"
        "from walk_models_beside import Go, S, Went\n\ndef decide" + rest + agg()
    )
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    config = tmp_path / "conf" / "t.toml"
    config.write_text('[eventstore]\nmodules = ["domain/walk.py"]\n')
    [walk] = load_aggregates(load_settings(config).eventstore.modules).values()
    assert walk.stream_type == "walk" and walk.state_type.__module__ == "walk_models_beside"


@pytest.mark.parametrize("command", [["init"], ["serve", "--port", "0"]])
def test_init_and_serve_stop_on_a_module_that_exits(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "walk.py").write_text(HEAD + "import sys\nsys.exit('bad')\n")
    config = tmp_path / "t.toml"
    config.write_text('[service]\ndsn = "postgresql://127.0.0.1:1/unreachable"\n[eventstore]\nmodules = ["walk.py"]\n')
    run = cli(*command, "--config", str(config), timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines == [f"tributary: {tmp_path / 'walk.py'}: line 20: the module called sys.exit('bad')"], run.stderr
