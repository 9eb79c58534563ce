"""`[api] workers = 2`: two uvicorn worker processes share the port, both serve the whole API,
and SIGTERM stops the supervisor and every worker."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port, served
from tests.waiting import Stalled, wait_progress
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e


def _children(pid: int) -> set[int]:
    """Every descendant of `pid`, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - out
        out |= frontier
    return out


def test_two_workers_serve_commands_and_stop_on_sigterm(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n[api]\nport = {port}\nworkers = 2\n'
        '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n'
    )
    base = f"http://127.0.0.1:{port}"
    with served(config, port, err_path=tmp_path / "serve.err") as proc:
        everyone = _children(proc.pid)
        workers = [p for p in everyone if "multiprocessing" in _cmdline(p)]
        assert len(workers) >= 2, f"expected two worker processes, found {workers}"

        opened = httpx.post(base + "/commands/account/w-1", json={"type": "open", "data": {"owner": "w"}})
        assert opened.status_code == 200, opened.text

        def deposit(i: int) -> int:
            with httpx.Client(base_url=base, timeout=30) as c:  # a new connection: any worker may answer
                return c.post("/commands/account/w-1", json={"type": "deposit", "data": {"amount": "1.00"}}).status_code

        with ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(deposit, range(40)))
        assert codes == [200] * 40
        state = httpx.get(base + "/streams/w-1/state").json()
        assert state["version"] == 41 and state["balance"] == "40.00"
    assert proc.returncode == 0, (tmp_path / "serve.err").read_text()  # `served` sent SIGTERM

    def left() -> dict[int, str]:
        return {p: _cmdline(p) for p in everyone if _alive(p)}

    try:  # while they go one by one, the set left shrinks
        wait_progress(lambda: not left(), lambda: tuple(left()), what="every process to end after SIGTERM", poll=0.2)
    except Stalled:
        raise AssertionError(f"processes outlived SIGTERM: {left()}") from None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; init reaps it


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return "?"
