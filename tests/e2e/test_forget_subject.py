"""Crypto-shredding end to end: a subject's distinctive values go through the event store,
capture (the log and its Parquet copies), a projection and the HTTP API; after
`DELETE /subjects/{id}` none of them is found anywhere: a pg_dump of the service database, every
file under the log root (and what its records and Parquet copies decode to), the projection's
rows and the HTTP answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pyarrow.parquet as pq
import pytest

from tests.domains.customers import customers, orders
from tests.integration.capture.helpers import records, wait_for
from tests.servers import free_port, serving
from tests.waiting import run_process
from tributary.api.devdb.embedded import find_bin_dir
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.personal import ERASED
from tributary.eventstore.store import EventStore
from tributary.log.local.log import Log

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NAME, EMAIL, ADDRESS = "Ottoline Vexworth-Quarrie", "ottoline.vq@nowhere.example", "17 Zanzibar Crescent"
SECRETS = (NAME, EMAIL, ADDRESS)

PROJECTION = """
from tributary.projections.definition import Fold, Projection, Table

def initial(key):
    return {"id": key, "name": None, "email": None, "address": None}

def apply(state, record):
    d = record.data
    if record.type == "Registered":
        return {**state, "name": d["name"], "email": d["email"]}
    if record.type == "EmailChanged":
        return {**state, "email": d["email"]}
    if record.type == "OrderPlaced":
        return {**state, "address": d["address"]}
    return state

def result(state):
    return {"stream_id": state["id"], "name": state["name"], "email": state["email"], "address": state["address"]}

PROJECTION = Projection(
    name="contacts", version=1, topics=("events.customer", "events.order"),
    table=Table.of({"stream_id": "text", "name": "text", "email": "text", "address": "text"}, ["stream_id"]),
    fold=Fold(initial=initial, apply=apply, result=result),
)
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_process(
        [sys.executable, "-c", "from tributary.api.cli.main import main; main()", *args],
        what=f"tributary {args[0]}",
        cwd=ROOT,
    )


def _contacts(dsn: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: r[1:] for r in conn.execute("SELECT stream_id, name, email, address FROM views.contacts")}


def _log_texts(root: Path) -> dict[str, str]:
    """Every file under the log root as bytes (latin-1 text), what each Parquet file decodes to,
    and every record of the events topics: where a value could survive."""
    out = {str(p): p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file()}
    for p in [*root.rglob("*.parquet"), *root.rglob("*.pq")]:
        out[f"{p} (decoded)"] = str(pq.read_table(p).to_pylist())
    for topic in ("events.customer", "events.order"):
        out[f"{topic} (records)"] = str([(r.key, r.value, r.headers) for r in records(root, topic)])
    return out


def _found(texts: dict[str, str]) -> list[tuple[str, str]]:
    return [(where, s) for where, text in texts.items() for s in SECRETS if s in text]


def test_forgetting_a_subject_leaves_its_values_nowhere(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    port, log_root = free_port(), tmp_path / "log"
    (tmp_path / "contacts.py").write_text(PROJECTION)
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{log_root}"\npartitions = 1\nsegment_bytes = 4096\n'
        f'[eventstore]\nmodules = ["{ROOT / "tests" / "domains" / "customers.py"}"]\n'
        f'[projections]\nmodules = ["{tmp_path / "contacts.py"}"]\nspark_master = "local[1]"\n'
        f"[api]\nport = {port}\n"
    )
    store = EventStore.connect(fresh_db)
    handler = CommandHandler(store, {"customer": customers(), "order": orders()}, snapshot_every=2)
    handler.handle("customer", "c-1", "register", {"name": NAME, "email": "first@nowhere.example"}, command_id="r1")
    handler.handle("customer", "c-1", "change_email", {"email": EMAIL})  # a snapshot of the state
    for i in range(20):  # enough records to seal segments (they get Parquet copies)
        handler.handle("order", f"o-{i}", "place", {"customer_id": "c-1", "address": ADDRESS, "amount": i})
    handler.handle("customer", "c-2", "register", {"name": "Someone Else", "email": "else@nowhere.example"})
    store.close()

    assert (r := _cli("init", "--config", str(config))).returncode == 0, r.stdout + r.stderr
    assert (r := _cli("capture", "--config", str(config), "--until-idle", "2")).returncode == 0, r.stderr
    with Log.open(log_root, writer=True) as log:
        assert log.write_parquet() > 0  # sealed segments now have their Parquet copies
    run = _cli("project", "run", "contacts", "--config", str(config))
    assert run.returncode == 0, run.stderr[-3000:]

    # Before: the log holds envelopes only; the projection folded the revealed values.
    logged = _log_texts(log_root)
    assert _found(logged) == [] and any('"$enc"' in t for t in logged.values())
    assert _contacts(fresh_db)["c-1"] == (NAME, EMAIL, None) and _contacts(fresh_db)["o-3"][2] == ADDRESS

    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        assert httpx.get(f"{base}/streams/c-1").json()["events"][0]["data"]["name"] == NAME
        assert httpx.get(f"{base}/streams/c-1/state").json()["email"] == EMAIL
        builds = {p["name"]: p["build"] for p in httpx.get(f"{base}/projections").json()}

        assert httpx.delete(f"{base}/subjects/c-1").status_code == 204

        def rebuilt() -> bool:
            rows = {p["name"]: p for p in httpx.get(f"{base}/projections").json()}
            return rows["contacts"]["build"] != builds["contacts"] and rows["contacts"]["rebuild"] is None

        wait_for(rebuilt, timeout=900, what="the rebuild the forget started")
        answers = {
            "stream": httpx.get(f"{base}/streams/c-1").text,
            "order stream": httpx.get(f"{base}/streams/o-3").text,
            "state": httpx.get(f"{base}/streams/c-1/state").text,
            "$all": httpx.get(f"{base}/all", params={"limit": 1000}).text,
            "subscribe": _subscribed(base),
            "replayed command": httpx.post(
                f"{base}/commands/customer/c-1",
                json={"type": "register", "data": {"name": NAME, "email": "first@nowhere.example"}, "command_id": "r1"},
            ).text.replace(NAME, ""),  # the request itself holds the name: only the answer counts
        }
        assert httpx.get(f"{base}/streams/c-1/state").json()["name"] == ERASED
        assert "Someone Else" in answers["$all"]  # other subjects are untouched

    dump = subprocess.run(
        [str(find_bin_dir() / "pg_dump"), "--dbname", fresh_db], capture_output=True, text=True, check=True
    ).stdout
    assert "Someone Else" in dump and "contacts" in dump  # the dump is of the right database
    assert _contacts(fresh_db)["c-1"] == (ERASED, ERASED, None) and _contacts(fresh_db)["o-3"][2] == ERASED
    assert _found({"pg_dump": dump, **answers, **_log_texts(log_root)}) == []


def _subscribed(base: str) -> str:
    """`/all/subscribe` until the stored events are sent (the stream stays open: read what came)."""
    text = ""
    with httpx.stream("GET", f"{base}/all/subscribe", params={"after": 0}, timeout=30) as response:
        for line in response.iter_lines():
            text += line + "\n"
            if text.count("\nid: ") + text.startswith("id: ") >= 23:
                break
    return text
