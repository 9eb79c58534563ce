"""`tributary serve` as the tests run it: a real uvicorn on a free loopback port."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from tests.waiting import STALL_S, Stalled, size_of, tree_cpu_s, wait_exit, wait_progress
from tributary.api.devdb.embedded import free_port

__all__ = ["ROOT", "free_port", "served", "serving"]

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def served(
    config: Path,
    port: int,
    *,
    err_path: Path,
    timeout: float = 60,
    ready: str = "/healthz",
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `tributary serve --config CONFIG` (running `preexec_fn` in the child first, e.g. to set
    a limit), wait for `ready` to answer 200, yield the process; SIGTERM it after and wait (its exit
    status is then `returncode`)."""
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "serve", "--config", str(config)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=preexec_fn,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                if httpx.get(base + ready, timeout=5).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            assert proc.poll() is None, err_path.read_text()
            return False

        try:  # `timeout`: how long its start may make no progress (CPU time, its log)
            wait_progress(
                up,
                lambda: (tree_cpu_s(proc.pid), size_of(err_path)),
                what=f"serve to answer {ready}",
                stall=max(timeout, STALL_S),
                poll=0.2,
            )
        except Stalled as stalled:
            raise AssertionError(f"{stalled}: {err_path.read_text()}") from None
        yield proc
    finally:
        proc.terminate()
        wait_exit(proc, what="serve to stop", progress=lambda: size_of(err_path), stall=max(30, STALL_S))


@contextlib.contextmanager
def serving(config: Path, port: int, *, err_path: Path, timeout: float = 60) -> Iterator[str]:
    """`served`, yielding the base URL."""
    with served(config, port, err_path=err_path, timeout=timeout):
        yield f"http://127.0.0.1:{port}"
