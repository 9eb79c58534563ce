"""The one switch for compiled code (`tributary/impl.py`, `TRIBUTARY_IMPL`): what each setting of
the environment selects, the one line when `compiled` is required but a module is missing, what
`tributary --version` and `/metrics` say, and the benchmarks' refusal to measure the fallback.

A missing build is simulated in a subprocess by an import hook that refuses the compiled module
(as Python does when the file is absent), never by changing what the selector answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg import REPO_ROOT
from tributary import __version__, impl

pytestmark = pytest.mark.unit

BOTH = "compiled: capture._hotpath, log._typed"


def _hide(*modules: str) -> str:
    """Code that makes `modules` unimportable, as if they were never built."""
    names = {impl.COMPILED[m] for m in modules}
    return (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name in {sorted(names)!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
    )


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the switch variables set as given (others removed)."""
    base = {k: v for k, v in os.environ.items() if k not in ("TRIBUTARY_IMPL", "TRIBUTARY_PURE_PYTHON")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**base, **env}, timeout=120, cwd=REPO_ROOT
    )


_VERSION = "import sys\nsys.argv = ['tributary', '--version']\nfrom tributary.api.cli.main import main\nmain()\n"
_TWINS = (
    "from tributary.capture import compiled\n"
    "from tributary.log.local import codec, codec_arrow, partitioner\n"
    "twins = [compiled.encode_inserts, compiled.take_copy, compiled.take_inserts,\n"
    "         codec._typed_plain, codec_arrow._typed_columns, partitioner._typed_split]\n"
    "print(''.join('c' if t is not None else 'p' for t in twins))\n"
)


# -- what the environment asks for (pure) -------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({}, None),
        ({"TRIBUTARY_IMPL": ""}, None),
        ({"TRIBUTARY_IMPL": "python"}, "python"),
        ({"TRIBUTARY_IMPL": "compiled"}, "compiled"),
        ({"TRIBUTARY_IMPL": " Compiled "}, "compiled"),
        ({"TRIBUTARY_PURE_PYTHON": "1"}, "python"),  # the older switch, an alias
        ({"TRIBUTARY_PURE_PYTHON": "0"}, None),  # as before: only "1" turns the compiled code off
        ({"TRIBUTARY_PURE_PYTHON": "1", "TRIBUTARY_IMPL": "python"}, "python"),
    ],
)
def test_the_mode_the_environment_asks_for(env: dict[str, str], mode: str | None) -> None:
    assert impl.requested(env) == mode


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"TRIBUTARY_IMPL": "cython"},
            "TRIBUTARY_IMPL='cython' is not one of: python, compiled (unset: compiled where built)",
        ),
        (
            {"TRIBUTARY_IMPL": "compiled", "TRIBUTARY_PURE_PYTHON": "1"},
            "TRIBUTARY_IMPL=compiled contradicts TRIBUTARY_PURE_PYTHON=1 (its older spelling of "
            "TRIBUTARY_IMPL=python): unset one of them",
        ),
    ],
)
def test_a_bad_setting_is_one_line(env: dict[str, str], line: str) -> None:
    with pytest.raises(impl.ImplError) as info:
        impl.requested(env)
    assert str(info.value) == line


def test_how_a_selection_reads() -> None:
    assert str(impl.Selection(compiled=("capture._hotpath", "log._typed"), python=())) == BOTH
    assert str(impl.Selection(compiled=(), python=("capture._hotpath", "log._typed"))) == "python"
    mixed = impl.Selection(compiled=("log._typed",), python=("capture._hotpath",))
    assert str(mixed) == "compiled: log._typed; python: capture._hotpath"
    assert [s.name for s in (mixed, impl.Selection(compiled=(), python=("a",)))] == ["mixed", "python"]


def test_this_checkout_runs_the_compiled_modules() -> None:
    """`pip install -e .` builds both: the test suite runs (and measures) the compiled path."""
    assert impl.selection() == impl.Selection(compiled=tuple(impl.COMPILED), python=())


# -- each mode, in a fresh process --------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "twins"),
    [
        ({}, "cccccc"),
        ({"TRIBUTARY_IMPL": "compiled"}, "cccccc"),
        ({"TRIBUTARY_IMPL": "python"}, "pppppp"),
        ({"TRIBUTARY_PURE_PYTHON": "1"}, "pppppp"),
    ],
)
def test_each_mode_selects_every_twin(env: dict[str, str], twins: str) -> None:
    out = _run(_TWINS, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == twins
    assert out.stderr == ""  # no warning when everything asked for is there


@pytest.mark.parametrize("env", [{"TRIBUTARY_IMPL": "python"}, {"TRIBUTARY_PURE_PYTHON": "1"}])
def test_python_never_loads_the_compiled_modules(env: dict[str, str]) -> None:
    code = _TWINS + "print(sorted(m for m in sys.modules if m.endswith(('._hotpath', '._typed'))))\n"
    out = _run("import sys\n" + code, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["pppppp", "[]"]


@pytest.mark.parametrize(
    ("hidden", "twins"), [("capture._hotpath", "pppccc"), ("log._typed", "cccppp")], ids=["hotpath", "typed"]
)
def test_unset_a_missing_module_costs_one_warning(hidden: str, twins: str) -> None:
    out = _run(_hide(hidden) + _TWINS + "from tributary import impl\nprint(impl.selection())\n", {})
    assert out.returncode == 0, out.stderr
    built = next(m for m in impl.COMPILED if m != hidden)
    assert out.stdout.splitlines() == [twins, f"compiled: {built}; python: {hidden}"]
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert f"the compiled module {hidden} is not available" in out.stderr
    assert "make setup" in out.stderr and "TRIBUTARY_IMPL=python" in out.stderr


@pytest.mark.parametrize("hidden", list(impl.COMPILED))
@pytest.mark.parametrize("first", ["tributary.capture.compiled", "tributary.log.local"])
def test_compiled_fails_loudly_when_a_module_is_missing(hidden: str, first: str) -> None:
    """Whichever twin is looked up first, every compiled module is required."""
    out = _run(_hide(hidden) + f"import {first}\n", {"TRIBUTARY_IMPL": "compiled"})
    assert out.returncode == 1
    last = out.stderr.splitlines()[-1]
    assert last.startswith("tributary.impl.ImplError: TRIBUTARY_IMPL=compiled, but the compiled module "), last
    assert f"{hidden} ({impl.COMPILED[hidden]}) is missing" in last


@pytest.mark.parametrize("hidden", list(impl.COMPILED))
def test_the_cli_says_what_is_missing_in_one_line(hidden: str) -> None:
    out = _run(_hide(hidden) + _VERSION, {"TRIBUTARY_IMPL": "compiled"})
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.splitlines() == [
        f"tributary: TRIBUTARY_IMPL=compiled, but the compiled module {hidden} ({impl.COMPILED[hidden]}) is "
        f"missing (No module named {impl.COMPILED[hidden]!r}): build it with `make setup` "
        "(or `pip install -e .` with a C compiler)"
    ]


def test_the_cli_refuses_a_bad_value_in_one_line() -> None:
    out = _run(_VERSION, {"TRIBUTARY_IMPL": "fast"})
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.splitlines() == [
        "tributary: TRIBUTARY_IMPL='fast' is not one of: python, compiled (unset: compiled where built)"
    ]


# -- what `--version` and /metrics say ----------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "env", "says"),
    [
        ("", {}, BOTH),
        ("", {"TRIBUTARY_IMPL": "compiled"}, BOTH),
        ("", {"TRIBUTARY_IMPL": "python"}, "python"),
        ("", {"TRIBUTARY_PURE_PYTHON": "1"}, "python"),
        (_hide("capture._hotpath"), {}, "compiled: log._typed; python: capture._hotpath"),
    ],
    ids=["unset", "compiled", "python", "pure-python", "one-missing"],
)
def test_version_names_the_implementation(prefix: str, env: dict[str, str], says: str) -> None:
    out = _run(prefix + _VERSION, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"tributary {__version__} ({says})\n"


def test_version_from_the_installed_command() -> None:
    command = Path(sys.executable).with_name("tributary")
    out = subprocess.run([str(command), "--version"], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout == f"tributary {__version__} ({BOTH})\n"


_METRICS = (
    "from pathlib import Path\n"
    "from tributary.api.http.metrics import Metrics\n"
    "from tributary.capture.status import read_status, write_status\n"
    "root = Path(sys.argv[1])\n"
    "write_status(root, pid=1, updated_ms=0, sources=[])  # as the capture daemon does\n"
    "m = Metrics()\n"
    "m.capture_build.status = read_status(root) or {}  # what `refresh` reads from the status file\n"
    "print(m.render().decode())\n"
)


def _info(process: str, impl_name: str, compiled: str) -> str:
    return (
        f'tributary_build_info{{compiled="{compiled}",impl="{impl_name}",process="{process}",'
        f'version="{__version__}"}} 1.0'
    )


@pytest.mark.parametrize(
    ("env", "impl_name", "compiled"),
    [({}, "compiled", "capture._hotpath,log._typed"), ({"TRIBUTARY_IMPL": "python"}, "python", "")],
)
def test_metrics_show_the_implementation_of_the_api_and_of_capture(
    tmp_path: Path, env: dict[str, str], impl_name: str, compiled: str
) -> None:
    out = _run("import sys\nsys.argv[1:] = [" + repr(str(tmp_path)) + "]\n" + _METRICS, env)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("tributary_build_info")]
    assert sorted(lines) == [_info("api", impl_name, compiled), _info("capture", impl_name, compiled)]


def test_metrics_leave_out_capture_before_its_first_status(tmp_path: Path) -> None:
    from tributary.api.http.metrics import Metrics

    text = Metrics().render().decode()
    assert [line for line in text.splitlines() if line.startswith("tributary_build_info")] == [
        _info("api", "compiled", "capture._hotpath,log._typed")
    ]


# -- the benchmarks -----------------------------------------------------------------------------


@pytest.mark.parametrize("bench", ["capture", "chunk_rows", "kafka_capture", "log_append", "log_cleaner"])
def test_benchmarks_refuse_the_fallback_unless_told(bench: str) -> None:
    """Before any work (no cluster is started): the refusal is the whole output."""
    script = REPO_ROOT / "bench" / f"{bench}.py"
    env = {**os.environ, "TRIBUTARY_IMPL": "python"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.splitlines() == [
        "bench: the typed twins would run as pure Python (python), which this benchmark does not measure "
        "unless told: build them (`make setup`), unset TRIBUTARY_IMPL, or pass --allow-python"
    ]


def test_a_benchmark_told_to_measures_the_fallback(tmp_path: Path) -> None:
    out_file = tmp_path / "out.json"
    script = REPO_ROOT / "bench" / "log_append.py"
    args = ["--records", "2000", "--repeat", "1", "--dir", str(tmp_path), "--out", str(out_file), "--allow-python"]
    out = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TRIBUTARY_IMPL": "python"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert '"impl": "python"' in out_file.read_text()
