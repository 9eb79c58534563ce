"""The package's shape, checked from the source: one namespace, layers that import downwards only,
no import cycles, and no private names of other packages or of dependencies."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import REPO_ROOT

pytestmark = pytest.mark.unit

# folder → package, as pyproject.toml's [tool.setuptools.package-dir] maps them
_PACKAGE_DIR = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
FOLDERS: dict[str, str] = {folder: package for package, folder in _PACKAGE_DIR.items()}
OTHER_CODE = ("tests", "bench")


def _files(*folders: str) -> Iterator[Path]:
    for folder in folders:
        found = sorted((REPO_ROOT / folder).rglob("*.py"))
        assert found, f"no Python files under {folder}/"
        yield from found


def _module(path: Path) -> str:
    rel = path.relative_to(REPO_ROOT)
    parts = [FOLDERS[rel.parts[0]], *rel.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module(p): p for p in _files(*FOLDERS)}


def _imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, imported names) of each import, wherever it stands; relative ones resolved."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            yield node.lineno, module, [a.name for a in node.names]


def test_nothing_imports_the_folders_by_their_own_names() -> None:
    """`import capture` finds nothing once installed: code says `tributary.capture`."""
    old = {f for f in FOLDERS if f != "tributary"}
    names = "|".join(sorted(old))
    spelled = re.compile(
        rf"(?:^|[;\n]\s*)(?:from (?:{names})(?:\.\w+)* import |import (?:{names})(?:\.\w+)*\s*(?:$|[;\n]))"
    )
    bad = []
    for path in _files(*FOLDERS, *OTHER_CODE):
        for line, module, _ in _imports(path):
            if module.split(".")[0] in old:
                bad.append(f"{path.relative_to(REPO_ROOT)}:{line}: {module}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and spelled.search(node.value):
                bad.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: code in a string imports {node.value!r}")
    assert bad == []


def test_http_and_settings_never_import_the_cli() -> None:
    bad = [
        f"{_module(p)} imports {m}"
        for p in _files("api/http", "api/settings")
        for _, m, names in _imports(p)
        if m.startswith("tributary.api.cli") or (m == "tributary.api" and "cli" in names)
    ]
    assert bad == []


def _private(module: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in module.split("."))


def test_no_private_module_or_name_is_imported_across_packages() -> None:
    """A module may use the underscore modules of its own package only; nobody imports a
    dependency's private names."""
    bad = []
    for mod, path in MODULES.items():
        home = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for line, target, names in _imports(path):
            where = f"{path.relative_to(REPO_ROOT)}:{line}"
            if target.split(".")[0] == "tributary":  # the root package too (`from tributary import __version__`)
                owner = target.rpartition(".")[0] if _private(target.rpartition(".")[2]) else target
                if _private(target) and not home.startswith(owner):
                    bad.append(f"{where}: {target}")
                for name in names:
                    if _private(name) and f"{target}.{name}" in MODULES and not home.startswith(target):
                        bad.append(f"{where}: {target}.{name}")
            elif target != "__future__":
                bad += [f"{where}: {target}.{n}" for n in names if n.startswith("_")]
                if _private(target):
                    bad.append(f"{where}: {target}")
    assert bad == []


def _graph() -> dict[str, set[str]]:
    """Imports between our modules, deferred (inside a function) and TYPE_CHECKING ones included:
    a cycle hidden by a late import is still two modules that cannot be understood apart."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for _, target, names in _imports(path):
            if not target.startswith("tributary"):
                continue
            subs = {f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES}
            for t in subs or {target}:
                if t in MODULES and t != mod:
                    graph[mod].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


# What builds on the log; `tributary.log` imports none of it.
ABOVE_THE_LOG = (
    "tributary.capture",
    "tributary.eventstore",
    "tributary.projections",
    "tributary.api",
    "tributary.consumers",
    "tributary.sinks",
)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_the_log_imports_no_layer_above_it() -> None:
    """The log is the lowest layer: capture, the event store, projections, consumers, sinks and
    the API build on it, never the other way round."""
    bad = [
        f"{_module(p)} imports {m}"
        for p in _files("log")
        for _, m, _names in _imports(p)
        if any(_within(m, above) for above in ABOVE_THE_LOG)
    ]
    assert bad == []


def test_the_implementation_switch_imports_nothing_of_the_project() -> None:
    """`tributary.impl` is the bottom layer: capture and the log both look their twins up there."""
    path = REPO_ROOT / "tributary" / "impl.py"
    assert [m for _, m, _names in _imports(path) if m.split(".")[0] == "tributary"] == []


def test_the_json_names_import_nothing_of_the_project() -> None:
    """`tributary.jsonvalue` is named by every layer, so it sits below them all."""
    path = REPO_ROOT / "tributary" / "jsonvalue.py"
    assert [m for _, m, _names in _imports(path) if m.split(".")[0] == "tributary"] == []


def test_the_local_log_imports_nothing_else() -> None:
    """The local backend stands alone (beside `tributary.impl`, the switch for its compiled twins):
    the contracts, the factory and Kafka's backend build on it."""
    bad = [
        f"{_module(p)} imports {m}"
        for p in _files("log/local")
        for _, m, _names in _imports(p)
        if m.startswith("tributary.") and not _within(m, "tributary.log.local") and m != "tributary.impl"
    ]
    assert bad == []


def _backend_writers(folder: str) -> list[str]:
    """Imports under `folder` of a backend's writer: the local `Log` or Kafka's writer module."""
    return [
        f"{_module(p)}:{line} imports {m} {names}"
        for p in _files(folder)
        for line, m, names in _imports(p)
        if _within(m, "tributary.log.kafka.writer") or (_within(m, "tributary.log.local") and "Log" in names)
    ]


def test_the_layout_check_sees_a_backend_writer() -> None:
    """The check below finds what it looks for (the local log's own admin opens a `Log`)."""
    assert any("tributary.log.local.admin" in hit for hit in _backend_writers("log/local"))


def test_capture_writes_through_the_contracts() -> None:
    """Capture names no backend's writer class and so cannot branch on one: it writes through
    `tributary.log`'s contracts (`CaptureWriter`, `SourceWriter`), opened by `open_writer`."""
    assert _backend_writers("capture") == []


def _client_settings(path: Path) -> list[int]:
    """Lines where `path` spells a Kafka client's settings: "bootstrap.servers" as a dict's key,
    written (`config["bootstrap.servers"] = …`) or read."""

    def named(node: ast.expr | None) -> bool:
        return isinstance(node, ast.Constant) and node.value == "bootstrap.servers"

    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if (isinstance(node, ast.Dict) and any(named(k) for k in node.keys))
        or (isinstance(node, ast.Subscript) and named(node.slice))
    ]


def test_one_place_builds_kafka_client_settings() -> None:
    """Producers', consumers' and admin clients' settings come from log/kafka/clients.py: the
    user's `[log.kafka] client` settings, the logger and read_committed are never forgotten."""
    home = REPO_ROOT / "log" / "kafka" / "clients.py"
    assert _client_settings(home), "the check finds the settings where they are built"
    bad = [f"{p.relative_to(REPO_ROOT)}:{line}" for p in _files(*FOLDERS) if p != home for line in _client_settings(p)]
    assert bad == []


# capture's sub-packages by phase: each imports only those before it, none the modules at the top
# (one source's session, the daemon and what runs them), which wire the phases together.
CAPTURE_PHASES = ("decoding", "records", "database", "snapshot", "streaming")
CAPTURE_TOP = ("source", "daemon", "resume", "prerequisites")


def _capture_part(module: str) -> str | None:
    """The phase (sub-package) or top-level module of capture that `module` is in, else None."""
    parts = module.split(".")
    return parts[2] if module.startswith("tributary.capture.") else None


def _phase_violations(imports: list[tuple[str, str]]) -> list[str]:
    """(importer, imported) pairs that break the phase order; `decoding` imports nothing else of capture."""
    bad = []
    for importer, target in imports:
        mine, theirs = _capture_part(importer), _capture_part(target)
        if mine not in CAPTURE_PHASES or theirs is None or theirs == mine:
            continue
        rank = CAPTURE_PHASES.index(mine)
        later = theirs in CAPTURE_PHASES and CAPTURE_PHASES.index(theirs) > rank
        if later or theirs in CAPTURE_TOP or (mine == "decoding" and theirs != "_hotpath"):
            bad.append(f"{importer} imports {target}")
    return bad


def test_the_phase_check_sees_a_wrong_import() -> None:
    pairs = [
        ("tributary.capture.decoding.wal2json", "tributary.capture.records.envelope"),
        ("tributary.capture.decoding.values", "tributary.capture.errors"),
        ("tributary.capture.snapshot.chunked", "tributary.capture.streaming.stream"),
        ("tributary.capture.database.slot", "tributary.capture.source"),
        ("tributary.capture.streaming.stream", "tributary.capture.snapshot.chunked"),  # allowed
        ("tributary.capture.source", "tributary.capture.streaming.stream"),  # allowed
    ]
    assert len(_phase_violations(pairs)) == 4


def test_capture_phases_import_downwards_only() -> None:
    """decoding → records → database → snapshot → streaming, then the session and daemon on top."""
    pairs = [
        (_module(p), t)
        for p in _files("capture")
        for _, m, names in _imports(p)
        for t in ({f"{m}.{n}" for n in names if f"{m}.{n}" in MODULES} or {m})
    ]
    assert {_capture_part(m) for m in MODULES} >= {*CAPTURE_PHASES, *CAPTURE_TOP}
    assert _phase_violations(pairs) == []


def _first_line(path: Path) -> str | None:
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    return doc.splitlines()[0] if doc else None


def test_no_two_modules_open_with_the_same_line() -> None:
    """A module's first docstring line says what it holds; two alike mean two names for one thing."""
    seen: dict[str, list[str]] = {}
    for path in _files(*FOLDERS):
        line = _first_line(path)
        if line is not None and path.name != "__init__.py":
            seen.setdefault(line, []).append(str(path.relative_to(REPO_ROOT)))
    assert {line: paths for line, paths in seen.items() if len(paths) > 1} == {}


def test_the_capture_package_docstring_maps_every_module() -> None:
    """capture/__init__.py names each module, so the map stays the way in."""
    doc = ast.get_docstring(ast.parse((REPO_ROOT / "capture" / "__init__.py").read_text())) or ""
    missing = [
        str(p.relative_to(REPO_ROOT)) for p in _files("capture") if p.stem != "__init__" and f"`{p.stem}`" not in doc
    ]
    assert missing == []
