"""Importing the user's own Python files (`[eventstore] modules`, `[projections] modules`) one way.

A file is imported under a name made from its absolute path, with its own directory at the front
of `sys.path` while it runs (as `python file.py` has it), so `from helpers import x` finds a file
beside it — in this process and in every Spark worker that loads the same file again. Whatever
the file raises while it runs, `sys.exit()` included (KeyboardInterrupt aside), leaves no
half-imported module behind; `describe` says it in one line with the file's line number.

`UserModules` is the loader both kinds of file share: domain modules (`eventstore/loader.py`) and
projection modules (`projections/loader.py`) differ only in what they export and what they say.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

__all__ = [
    "Messages",
    "UserModules",
    "describe",
    "file_stamp",
    "forget",
    "import_file",
    "is_path",
    "module_name",
    "where",
]

T = TypeVar("T")

# `sys.path` is the process's: two threads importing files must not remove each other's entries.
_path_lock = threading.RLock()
_siblings: dict[str, tuple[str, ...]] = {}  # a file's module → the modules beside it that it imported


def is_path(ref: str) -> bool:
    """A file reference (`x/y.py`), as opposed to a dotted module name."""
    return ref.endswith(".py") or "/" in ref


def file_stamp(ref: str) -> tuple[str, int, int] | None:
    """(path, mtime_ns, size) of the file a reference names, None when it has none (a namespace):
    a long-running process imports a module again when its stamp changed."""
    if is_path(ref):
        path = Path(ref).resolve()
    else:
        try:
            spec = importlib.util.find_spec(ref)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.origin or not spec.has_location:
            return None
        path = Path(spec.origin)
    try:
        st = path.stat()
    except OSError:
        return None
    return str(path), st.st_mtime_ns, st.st_size


def module_name(prefix: str, path: Path) -> str:
    """The name a file is imported under: one per absolute path, so two `orders.py` never clash."""
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:8]
    return f"{prefix}_{resolved.stem}_{digest}"


def import_file(path: Path, name: str) -> ModuleType:
    """Run the file as module `name` (or return it when this process already has), with the file's
    directory importable while it runs. Raises what the file raises; `ImportError` when the file
    is not a Python module."""
    if name in sys.modules:
        return sys.modules[name]
    path = path.resolve()
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError("not a Python module")
    module = importlib.util.module_from_spec(spec)
    home = str(path.parent)
    with _path_lock:
        before = set(sys.modules)
        sys.modules[name] = module
        sys.path.insert(0, home)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            with contextlib.suppress(ValueError):  # the file took it off itself
                sys.path.remove(home)  # the first occurrence: ours
        _siblings[name] = tuple(m for m in set(sys.modules) - before - {name} if _beside(sys.modules[m], home))
    return module


def _beside(module: ModuleType | None, home: str) -> bool:
    origin = getattr(module, "__file__", None)
    return isinstance(origin, str) and os.path.abspath(origin).startswith(home + os.sep)


def forget(name: str) -> None:
    """Drop module `name`, and the modules beside its file that it imported, from this process:
    the next `import_file` runs the file (and those) again."""
    with _path_lock:
        sys.modules.pop(name, None)
        for sibling in _siblings.pop(name, ()):
            sys.modules.pop(sibling, None)


def where(exc: BaseException, ref: str) -> str:
    """`line N: ` of the innermost frame in the module's own file, when there is one."""
    target = str(Path(ref).resolve()) if is_path(ref) else ref.replace(".", "/")
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == target or frame.filename.endswith(target + ".py"):
            line = frame.lineno
    return f"line {line}: " if line else ""


def describe(exc: BaseException, ref: str) -> str:
    """`ref: line N: Type: first line of the message`, for an exception raised importing `ref`."""
    if isinstance(exc, SyntaxError):
        line = f"line {exc.lineno}: " if exc.lineno else ""
        return f"{ref}: {line}{type(exc).__name__}: {exc.msg}"
    if isinstance(exc, SystemExit):  # `sys.exit("bad")` at import: the module stopped itself
        arg = "" if exc.code is None else repr(exc.code)
        return f"{ref}: {where(exc, ref)}the module called sys.exit({arg})"
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{ref}: {where(exc, ref)}{type(exc).__name__}{(': ' + first) if first else ''}"


@dataclass(frozen=True, kw_only=True)
class Messages:
    """What a loader says, as `str.format` templates; each names the module (`ref`)."""

    no_file: str  # {ref}: a path to no file
    no_module: str  # {ref}, {exc}: a dotted name that does not import
    exports_none: str  # {ref}: the module exports neither name
    exports_other: str  # {ref}, {type}: an export is not of the loader's kind
    # {ref}, {where}, {exc}: a definition in the module broke a rule (raised the loader's own error)
    # while it ran; None: that error is raised as it is (its message names the definition)
    broken_rule: str | None = None


class UserModules(Generic[T]):
    """Loads one kind of user module: imports a file or a dotted module, collects what it exports (`one`
    object or a list of `many`, each a `kind`), and forgets modules whose files changed. Every problem
    raises `error` with one line of `messages`, naming the module."""

    def __init__(
        self, *, prefix: str, kind: type[T], one: str, many: str, error: type[Exception], messages: Messages
    ) -> None:
        self.prefix, self.kind, self.one, self.many = prefix, kind, one, many
        self.error, self.messages = error, messages
        self.lock = threading.RLock()  # held by a caller across `forget_changed` and its load
        self._stamps: dict[str, tuple[str, int, int] | None] = {}

    def load_module(self, ref: str) -> ModuleType:
        """Import a file (`x/y.py`; `load_settings` makes it absolute, beside the config file) or a
        dotted module. The file's directory is importable while it runs (`from helpers import x`).
        Whatever the module raises (`sys.exit()` too) is one line naming it."""
        if is_path(ref) and not Path(ref).is_file():
            raise self.error(self.messages.no_file.format(ref=ref))
        try:
            if is_path(ref):
                return import_file(Path(ref), module_name(self.prefix, Path(ref)))
            return importlib.import_module(ref)
        except self.error as exc:
            if self.messages.broken_rule is None:
                raise
            raise self.error(self.messages.broken_rule.format(ref=ref, where=where(exc, ref), exc=exc)) from None
        except ModuleNotFoundError as exc:
            if not is_path(ref) and exc.name is not None and ref.startswith(exc.name):
                raise self.error(self.messages.no_module.format(ref=ref, exc=exc)) from None
            raise self.error(describe(exc, ref)) from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a user's module may raise anything, sys.exit() too; said in one line
            raise self.error(describe(exc, ref)) from None

    def exports(self, module: ModuleType, ref: str) -> list[T]:
        """What the module exports: its list under `many`, else its one object under `one`."""
        found: Any = getattr(module, self.many, None)
        if found is None:
            single = getattr(module, self.one, None)
            found = [] if single is None else [single]
        if isinstance(found, self.kind):
            found = [found]
        try:
            out = list(found)
        except TypeError:  # not a list of them: said below as the wrong type
            out = [found]
        if not out:
            raise self.error(self.messages.exports_none.format(ref=ref))
        for item in out:
            if not isinstance(item, self.kind):
                raise self.error(self.messages.exports_other.format(ref=ref, type=type(item).__name__))
        return out

    def forget_changed(self, refs: Sequence[str]) -> bool:
        """Forget every module whose file changed since this process last looked (the next load runs
        it again), so that a long-running process follows edits; unchanged files cost a `stat` each.
        Whether any changed. Call it holding `lock`."""
        changed = False
        for ref in refs:
            stamp = file_stamp(ref)
            if ref in self._stamps and self._stamps[ref] != stamp:
                changed = True
                if is_path(ref):
                    forget(module_name(self.prefix, Path(ref)))
                else:
                    sys.modules.pop(ref, None)
            self._stamps[ref] = stamp
        return changed
