"""The user's files load one way for aggregates and projections: paths beside the config file
(absolute once loaded), sibling imports while a file loads, anything it raises as one line; and
the logs beside the log root stay bounded."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from tributary.api.cli.project import TRACE_BYTES, _reporting
from tributary.api.settings.config import load_settings
from tributary.eventstore.errors import AggregateDefinitionError
from tributary.eventstore.loader import load_module as load_domain
from tributary.projections.errors import DefinitionError, ProjectionError, RunError
from tributary.projections.loader import load_current
from tributary.projections.loader import load_module as load_projection
from tributary.projections.runner import RunSettings
from tributary.projections.spark import jvm_log, log_jvm_to, rotate
from tributary.user_files import import_file, module_name

pytestmark = pytest.mark.unit


def _sibling_pair(folder: Path, helper: str) -> Path:
    """`main.py` importing `<helper>.py` beside it; the helper's name is unique to the test."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{helper}.py").write_text("def double(x):\n    return 2 * x\n")
    main = folder / "main.py"
    main.write_text(f"from {helper} import double\n\nVALUE = double(21)\n")
    return main


def test_a_file_imports_its_siblings_and_leaves_sys_path_as_it_was(tmp_path: Path) -> None:
    main = _sibling_pair(tmp_path / "pkg", "helper_for_sibling_test")
    before = list(sys.path)
    module = import_file(main, module_name("t_sibling", main))
    assert module.VALUE == 42
    assert sys.path == before
    assert import_file(main, module_name("t_sibling", main)) is module  # once per process


def test_an_edited_projection_file_is_read_again_with_the_helpers_it_imports(tmp_path: Path) -> None:
    helper = tmp_path / "reload_helper_for_test.py"
    main = tmp_path / "reloaded.py"
    source = (
        "from reload_helper_for_test import N\n"
        "from tributary.projections.definition import Fold, Projection, Table\n"
        "PROJECTION = Projection(name='reloaded', version=N, topics=('events.x',),\n"
        "    table=Table.of({'k': 'text'}, ['k']), fold=Fold(initial=lambda k: k, apply=lambda s, r: s,\n"
        "    result=lambda s: {'k': s}))\n"
    )
    helper.write_text("N = 1\n")
    main.write_text(source)
    assert load_current((str(main),))["reloaded"].version == 1
    helper.write_text("N = 2\n")
    main.write_text(source + "# edited\n")
    assert load_current((str(main),))["reloaded"].version == 2


def test_a_failing_file_leaves_no_module_behind(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.exit('bad')\n")
    name = module_name("t_bad", bad)
    before = list(sys.path)
    with pytest.raises(SystemExit):
        import_file(bad, name)
    assert name not in sys.modules and sys.path == before


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("import sys\n\nsys.exit('bad')\n", "line 3: the module called sys.exit('bad')"),
        ("import sys\nsys.exit()\n", "line 2: the module called sys.exit()"),
        ("import sys\nsys.exit(3)\n", "line 2: the module called sys.exit(3)"),
        ("raise GeneratorExit\n", "line 1: GeneratorExit"),
        ("x = 1\nraise RuntimeError('no config\\nsecond line')\n", "line 2: RuntimeError: no config"),
        ("from helper_that_is_not_there import x\n", "line 1: ModuleNotFoundError: No module named"),
    ],
)
@pytest.mark.parametrize("kind", ["domain", "projection"])
def test_what_a_module_raises_at_import_is_one_line_naming_it(
    tmp_path: Path, source: str, words: str, kind: str
) -> None:
    path = tmp_path / f"{kind}_raising.py"
    path.write_text(source)
    error = AggregateDefinitionError if kind == "domain" else DefinitionError
    load = load_domain if kind == "domain" else load_projection
    with pytest.raises(error) as refused:
        load(str(path))
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and words in message and "\n" not in message, message
    assert refused.value.__cause__ is None


def test_keyboard_interrupt_is_not_swallowed(tmp_path: Path) -> None:
    path = tmp_path / "interrupted.py"
    path.write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_projection(str(path))


def test_modules_of_both_sections_are_absolute_beside_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    for f in ("domain/a.py", "proj/p.py"):
        (conf / f).parent.mkdir(parents=True, exist_ok=True)
        (conf / f).write_text("")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    config = Path("../conf/t.toml")
    config.write_text(
        '[eventstore]\nmodules = ["domain/a.py", "some.module"]\n'
        f'[projections]\nmodules = ["proj/p.py", "other.module", "{tmp_path / "abs.py"}", "missing/x.py"]\n'
    )
    s = load_settings(config)
    root = conf.resolve()
    assert s.eventstore.modules == (str(root / "domain/a.py"), "some.module")
    assert s.projections.modules == (
        str(root / "proj/p.py"),
        "other.module",
        str(tmp_path / "abs.py"),
        str(root / "missing/x.py"),
    )


def test_a_path_relative_to_the_working_directory_still_loads_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "legacy_cwd.py").write_text("")
    monkeypatch.chdir(tmp_path)
    config = Path("conf/t.toml")
    config.write_text('[projections]\nmodules = ["proj/legacy_cwd.py"]\n')
    with caplog.at_level(logging.WARNING, logger="tributary.api.settings.config"):
        first = load_settings(config)
        again = load_settings(config)
    assert first.projections.modules == again.projections.modules == (str((tmp_path / "proj/legacy_cwd.py").resolve()),)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "'proj/legacy_cwd.py' is found relative to the working directory" in warning
    assert "write it as '../proj/legacy_cwd.py'" in warning and "\n" not in warning


def test_environment_paths_are_absolute_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "t.toml"
    config.write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRIBUTARY_PROJECTIONS__MODULES", '["here/p.py", "a.module"]')
    monkeypatch.setenv("TRIBUTARY_EVENTSTORE__MODULES", '["here/d.py"]')
    s = load_settings(config)
    assert s.projections.modules == (str(tmp_path.resolve() / "here/p.py"), "a.module")
    assert s.eventstore.modules == (str(tmp_path.resolve() / "here/d.py"),)


def test_rotate_moves_a_full_log_aside_and_leaves_a_small_one(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    rotate(log, 100)  # none yet: nothing to do
    log.write_bytes(b"x" * 99)
    rotate(log, 100)
    assert log.stat().st_size == 99 and not (tmp_path / "spark.log.1").exists()
    log.write_bytes(b"old" * 40)
    (tmp_path / "spark.log.1").write_bytes(b"older")
    rotate(log, 100)
    assert not log.exists() and (tmp_path / "spark.log.1").read_bytes() == b"old" * 40


def test_project_log_is_capped(tmp_path: Path) -> None:
    s = RunSettings(dsn="postgresql://127.0.0.1:1/x", log_root=tmp_path / "log")
    trace = tmp_path / "project.log"
    trace.write_bytes(b"x" * TRACE_BYTES)
    failure = ProjectionError("projection 'p' failed")
    failure.__cause__ = RuntimeError("boom")
    jvm = jvm_log()
    try:
        with pytest.raises(RunError, match="full trace in"), _reporting(s):
            raise failure
    finally:
        log_jvm_to(jvm)  # `_reporting` points the JVM's log beside the log root
    assert (tmp_path / "project.log.1").stat().st_size == TRACE_BYTES
    assert 0 < trace.stat().st_size < TRACE_BYTES and "boom" in trace.read_text()
