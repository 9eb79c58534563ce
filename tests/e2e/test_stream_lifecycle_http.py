"""A stream's lifecycle as a user drives it: `tributary serve` on a real port (metadata with its
own expected version, deletes, 404/410 problems, scopes, the background scavenge) and the
`tributary events` commands."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.integration.capture.helpers import cli
from tests.servers import free_port, serving
from tests.waiting import wait_progress
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

WRITE, ADMIN = "k-write-123", "k-admin-789"


@pytest.fixture
def served(fresh_db: str, tmp_path: Path) -> Iterator[tuple[httpx.Client, httpx.Client, Path, str]]:
    run_migrations(fresh_db)
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n'
        f"[api]\nport = {port}\n"
        f'keys = [{{ key = "{WRITE}", scopes = ["write", "read"] }}, {{ key = "{ADMIN}", scopes = ["admin"] }}]\n'
        '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\nscavenge_interval_s = 0.5\nsnapshot_every = 2\n'
    )
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        writer = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {WRITE}"}, timeout=30)
        admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        try:
            yield writer, admin, config, fresh_db
        finally:
            writer.close()
            admin.close()


def cmd(client: httpx.Client, stream: str, type_: str, data: dict[str, object], **extra: object) -> httpx.Response:
    return client.post(f"/commands/account/{stream}", json={"type": type_, "data": data, **extra})


def _stored(dsn: str, stream: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version FROM eventstore.events WHERE stream_id = %s ORDER BY 1", (stream,))
        return [int(r[0]) for r in rows]


def test_metadata_and_the_background_scavenge(served: tuple[httpx.Client, httpx.Client, Path, str]) -> None:
    writer, admin, _, dsn = served
    cmd(writer, "acc", "open", {"owner": "ann"})
    for _ in range(4):
        assert cmd(writer, "acc", "deposit", {"amount": "1.00"}).status_code == 200
    assert writer.get("/streams/acc/metadata").json() == {
        "stream_id": "acc",
        "max_age": None,
        "max_count": None,
        "truncate_before": None,
        "custom": {},
        "version": 0,
    }
    body = {"max_count": 2, "custom": {"team": "ops"}, "expected_metadata_version": 0}
    assert writer.put("/streams/acc/metadata", json=body).status_code == 403  # writing metadata removes events
    put = admin.put("/streams/acc/metadata", json=body)
    assert put.status_code == 200, put.text
    assert put.json()["version"] == 1 and put.json()["max_count"] == 2
    conflict = admin.put("/streams/acc/metadata", json=body)
    assert conflict.status_code == 409
    assert (conflict.json()["code"], conflict.json()["expected"], conflict.json()["actual"]) == (
        "metadata_conflict",
        0,
        1,
    )
    assert admin.put("/streams/acc/metadata", json={"max_count": 0}).status_code == 422
    read = writer.get("/streams/acc").json()["events"]
    assert [e["version"] for e in read] == [4, 5]  # hidden at once
    backwards = writer.get("/streams/acc", params={"direction": "backwards"}).json()["events"]
    assert [e["version"] for e in backwards] == [5, 4]
    assert [e["version"] for e in writer.get("/all").json()["events"]] == [4, 5]
    wait_progress(lambda: _stored(dsn, "acc") == [4, 5], lambda: tuple(_stored(dsn, "acc")), what="the scavenge")
    # a command continues after removed events from the snapshot that covers them (taken at 4)
    deposit = cmd(writer, "acc", "deposit", {"amount": "1.00"})
    assert deposit.status_code == 200, deposit.text
    assert deposit.json()["version"] == 6
    assert writer.get("/streams/acc/state").json()["balance"] == "5.00"
    # the snapshot (at 2) does not cover version 3, hidden by truncate_before: refused, not a wrong state
    cmd(writer, "bare", "open", {"owner": "bo"})
    cmd(writer, "bare", "deposit", {"amount": "1.00"})
    cmd(writer, "bare", "deposit", {"amount": "1.00"})
    assert admin.put("/streams/bare/metadata", json={"truncate_before": 4}).status_code == 200
    hidden = cmd(writer, "bare", "deposit", {"amount": "1.00"})
    assert hidden.status_code == 409 and hidden.json()["code"] == "history_hidden", hidden.text


def test_soft_and_hard_delete(served: tuple[httpx.Client, httpx.Client, Path, str]) -> None:
    writer, admin, config, _ = served
    for name in ("soft", "hard", "cli"):
        assert cmd(writer, name, "open", {"owner": name}).status_code == 200
    assert writer.delete("/streams/soft").status_code == 403
    deleted = admin.delete("/streams/soft")
    assert deleted.status_code == 200 and deleted.json() == {"stream_id": "soft", "hard": False, "version": 1}
    assert writer.get("/streams/soft").status_code == 404
    assert admin.delete("/streams/soft").status_code == 404
    again = cmd(writer, "soft", "open", {"owner": "again"}, expected_version="no_stream")
    assert again.status_code == 200, again.text
    assert again.json()["version"] == 2
    assert [e["version"] for e in writer.get("/streams/soft").json()["events"]] == [2]
    assert writer.get("/streams/soft/state").json()["owner"] == "again"

    assert admin.delete("/streams/hard", params={"hard": "true"}).status_code == 200
    for response in (
        writer.get("/streams/hard"),
        writer.get("/streams/hard/state"),
        writer.get("/streams/hard/metadata"),
        cmd(writer, "hard", "open", {"owner": "x"}),
        admin.delete("/streams/hard"),
    ):
        assert response.status_code == 410, response.text
        assert response.json()["code"] == "stream_deleted"

    deleted_cli = cli("events", "delete", "cli", "--hard", "--config", str(config))
    assert deleted_cli.returncode == 0, deleted_cli.stderr
    assert "deleted for good" in deleted_cli.stdout
    assert writer.get("/streams/cli").status_code == 410
    refused = cli("events", "delete", "cli", "--config", str(config))
    assert refused.returncode == 1 and refused.stderr.strip().startswith("tributary: stream 'cli' was deleted for good")
    scavenged = cli("events", "scavenge", "--config", str(config))
    assert scavenged.returncode == 0 and "event(s) removed" in scavenged.stdout
