"""Event store benchmark: appends/s through the store vs raw single-row INSERTs, in one run.

Default durability (fsync on, synchronous_commit on), one event per transaction, 1 and 4 writers;
plus loading an aggregate of 10,000 events with and without a snapshot. Prints JSON.

    .venv/bin/python bench/eventstore.py                  # embedded Postgres in a temp dir
    .venv/bin/python bench/eventstore.py --seconds 5 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.embedded_pg import EmbeddedPostgres  # noqa: E402
from eventstore.domain.bank import bank_account  # noqa: E402
from eventstore.handler import CommandHandler  # noqa: E402
from eventstore.migrate import run_migrations  # noqa: E402
from eventstore.model import NewEvent  # noqa: E402
from eventstore.store import EventStore  # noqa: E402

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS raw_events (
  global_position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, stream_id text NOT NULL,
  stream_type text NOT NULL, version bigint NOT NULL, event_id uuid NOT NULL UNIQUE, type text NOT NULL,
  schema_version int NOT NULL, data jsonb NOT NULL, metadata jsonb NOT NULL,
  occurred_at timestamptz NOT NULL DEFAULT now(), recorded_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (stream_id, version))
"""


def _run_threads(n: int, seconds: float, work: object) -> int:
    counts = [0] * n
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            work(i, counts[i])  # type: ignore[operator]
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def raw_inserts(dsn: str, writers: int, seconds: float) -> float:
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(writers)]
    tag = uuid.uuid4().hex[:6]

    def work(i: int, k: int) -> None:
        conns[i].execute(
            "INSERT INTO raw_events (stream_id, stream_type, version, event_id, type, schema_version, data, metadata) "
            "VALUES (%s, 'bench', %s, %s, 'Happened', 1, '{\"amount\": \"1.00\"}', '{}')",
            (f"raw-{tag}-{i}", k + 1, uuid.uuid4()),
        )

    n = _run_threads(writers, seconds, work)
    for c in conns:
        c.close()
    return n / seconds


def store_appends(store: EventStore, writers: int, seconds: float) -> float:
    tag = uuid.uuid4().hex[:6]

    def work(i: int, k: int) -> None:
        store.append(f"es-{tag}-{i}", "bench", [NewEvent(type="Happened", data={"amount": "1.00"})], k)

    return _run_threads(writers, seconds, work) / seconds


def load_times(store: EventStore, events: int) -> dict[str, float]:
    handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=None)
    stream = f"big-{uuid.uuid4().hex[:6]}"
    handler.handle("account", stream, "open", {"owner": "bench"})
    batch = 500
    for start in range(1, events, batch):
        n = min(batch, events - start)
        store.append(
            stream, "account", [NewEvent(type="MoneyDeposited", data={"amount": "1.00"}) for _ in range(n)], start
        )
    t0 = time.perf_counter()
    plain = handler.load("account", stream, use_snapshot=False)
    no_snap = time.perf_counter() - t0
    state = plain.state.model_dump(mode="json")
    store.save_snapshot(stream, "account", plain.version, state, 1)
    snap_handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=100)
    t0 = time.perf_counter()
    loaded = snap_handler.load("account", stream)
    with_snap = time.perf_counter() - t0
    assert loaded.state == plain.state
    return {"events": plain.version, "load_s_without_snapshot": no_snap, "load_s_with_snapshot": with_snap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--load-events", type=int, default=10_000)
    parser.add_argument("--dsn", help="use this server instead of an embedded one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "eventstore.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-"))
    cluster = None
    if args.dsn:
        dsn = args.dsn
    else:
        cluster = EmbeddedPostgres(work / "pg")
        cluster.up()
        dsn = cluster.dsn()
    try:
        run_migrations(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(RAW_TABLE)
        store = EventStore.connect(dsn, max_size=8)
        runs: dict[str, list[float]] = {}
        for _ in range(args.repeat):  # interleaved, so noise hits both sides alike
            for writers in (1, 4):
                runs.setdefault(f"raw_{writers}w", []).append(raw_inserts(dsn, writers, args.seconds))
                runs.setdefault(f"store_{writers}w", []).append(store_appends(store, writers, args.seconds))
        med = {k: round(statistics.median(v), 1) for k, v in runs.items()}
        result = {
            "appends_per_s_median": med,
            "ratio_store_vs_raw": {w: round(med[f"store_{w}"] / med[f"raw_{w}"], 3) for w in ("1w", "4w")},
            "target_ratio": 0.8,
            "load": load_times(store, args.load_events),
            "runs": args.repeat,
            "seconds_per_run": args.seconds,
        }
        store.close()
    finally:
        if cluster is not None:
            cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
