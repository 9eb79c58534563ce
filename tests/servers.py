"""`tributary serve` as the tests run it: a real uvicorn on a free loopback port."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

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
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(base + ready, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, err_path.read_text()
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def serving(config: Path, port: int, *, err_path: Path, timeout: float = 60) -> Iterator[str]:
    """`served`, yielding the base URL."""
    with served(config, port, err_path=err_path, timeout=timeout):
        yield f"http://127.0.0.1:{port}"
