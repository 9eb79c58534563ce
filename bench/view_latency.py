"""Benchmark: seconds from a commit to the log until a continuous projection's view shows it.

For each rate (events/s): a paced writer appends `MoneyDeposited` events for --keys accounts to
`events.account` (4 partitions) through the log's own writer (one commit per writer tick of
--tick-ms, as capture commits a transaction's records at once) for --seconds; `run_continuous`
(what `tributary project run account_balances --continuous` runs) keeps `account_balances` caught
up in another process, started and warm before the writer starts; two samplers poll every
--poll-ms:
  * view  — `SELECT account_id, last_version FROM views.account_balances`: an event (account, its
            n-th version) is visible once the account's `last_version` reaches n;
  * log   — a `LogView` reader (as consumer groups and sinks read the log) refreshed each poll: an
            event is visible once its partition's committed end passes its offset.
Latency = time seen by a sampler - time the writer's `commit()` returned (durable), per event.
Prints JSON (p50/p99/max per rate and sampler, and view/log ratios) and saves it to
bench/results/view_latency.json.

    python bench/view_latency.py [--rates 100,1000] [--seconds 30] [--keys 1000] [--dsn DSN]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

import orjson  # noqa: E402
import psycopg  # noqa: E402

from tributary.log.local import Log, LogView, TopicConfig, canonical_json, partition_for  # noqa: E402
from tributary.projections.records import ms_to_iso  # noqa: E402

TOPIC = "events.account"
PARTS = 4
NAME = "account_balances"
MODULE = "tributary.projections.examples.account_balances"


@dataclass
class Written:
    """What the writer committed: per event (account, version, topic-partition, offset), and when."""

    commits: list[float] = field(default_factory=list)  # commit() returned, perf_counter
    events: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # key, version, part, offset, commit#


def event(i: int, key: int, version: int) -> tuple[bytes, bytes, int]:
    """One deposit of 1.00 to account `key`, its `version`-th event."""
    now = int(time.time() * 1000)
    value = orjson.dumps(
        {
            "id": f"e{i}",
            "stream": f"acc-{key}",
            "version": version,
            "type": "MoneyDeposited",
            "schema_version": 1,
            "data": {"amount": "1.00"},
            "metadata": {},
            "occurred_at": ms_to_iso(now),
            "recorded_at": ms_to_iso(now),
        }
    )
    return canonical_json(f"acc-{key}"), value, now


def paced_log_writes(log: Log, rate: int, seconds: float, keys: int, tick_s: float, out: Written) -> None:
    """Append `rate` events a second for `seconds`, committing what is due every `tick_s`."""
    versions = [0] * keys
    i = 0
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        due = int(elapsed * rate) + 1
        batch: dict[int, list[tuple[int, int]]] = {}
        while i < due:
            key = i % keys
            versions[key] += 1
            k, v, ts = event(i, key, versions[key])
            part = partition_for(k, PARTS)
            first = log.append(TOPIC, part, [(k, v, ts, None)])
            batch.setdefault(part, []).append((key, versions[key]))
            out.events.append((key, versions[key], part, first, len(out.commits)))
            i += 1
        if batch:
            log.commit()
            out.commits.append(time.perf_counter())
        time.sleep(max(0.0, tick_s - (time.perf_counter() - t0 - elapsed)))


Changes = dict[int, list[tuple[int, float]]]  # per key: (value it grew to, when it was read)


def sample(poll_s: float, stop: Callable[[], bool], read: Callable[[], dict[int, int]]) -> Changes:
    """`read()` every `poll_s` until `stop()`, then once more, keeping when each value grew."""
    last: dict[int, int] = {}
    changes: Changes = {}
    while True:
        done = stop()
        now = read()
        at = time.perf_counter()
        for k, v in now.items():
            if v > last.get(k, -1):
                changes.setdefault(k, []).append((v, at))
                last[k] = v
        if done:
            return changes
        time.sleep(poll_s)


def first_seen(changes: Changes, key: int, value: int) -> float | None:
    """When the key's value first reached `value` (values only grow: bisect)."""
    seen = changes.get(key, [])
    i = bisect.bisect_left(seen, value, key=lambda c: c[0])
    return seen[i][1] if i < len(seen) else None


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(lat: list[float]) -> dict[str, Any]:
    return {
        "p50_ms": round(pct(lat, 0.5) * 1000, 1),
        "p99_ms": round(pct(lat, 0.99) * 1000, 1),
        "max_ms": round(max(lat) * 1000, 1),
    }


def child(raw: str) -> None:
    """The continuous runner's process: `run_continuous` until SIGTERM."""
    import signal

    from tributary.projections.runner import RunSettings, run_continuous

    a = json.loads(raw)
    stopping = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(flag=True))
    s = RunSettings(
        dsn=a["dsn"],
        log_root=Path(a["root"]),
        modules=(MODULE,),
        spark_master=a["master"],
        shuffle_partitions=a["partitions"],
    )
    passes = run_continuous(NAME, s, freshness_s=a["freshness"], stop=lambda: stopping["flag"])
    print(json.dumps({"passes": passes}), flush=True)


def view_versions(dsn: str) -> Callable[[], dict[int, int]]:
    conn = psycopg.connect(dsn, autocommit=True)

    def read() -> dict[int, int]:
        try:
            rows = conn.execute(f"SELECT account_id, last_version FROM views.{NAME}").fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
        return {int(a[4:]): v for a, v in rows}

    return read


def log_ends(root: Path) -> Callable[[], dict[int, int]]:
    view = LogView(root)

    def read() -> dict[int, int]:
        view.refresh()
        return {p: e.end for (t, p), e in view.ends.items() if t == TOPIC}

    return read


def wait_caught_up(dsn: str, want: int, deadline_s: float) -> None:
    """Until the view holds `want` accounts (the runner's first pass, JVM start-up, is done)."""
    read = view_versions(dsn)
    t0 = time.monotonic()
    while len(read()) < want:
        if time.monotonic() - t0 > deadline_s:
            raise SystemExit("the continuous runner did not build the view in time (see its stderr)")
        time.sleep(0.2)


def one_rate(rate: int, args: argparse.Namespace, dsn: str, work: Path) -> dict[str, Any]:
    root = work / f"log-{rate}"
    log = Log.open(root, writer=True)
    log.create_topic(TOPIC, TopicConfig(partitions=PARTS))
    for key in range(args.keys):  # every account exists before the run: the view's warm-up
        k, v, ts = event(-1 - key, key, 0)
        log.append(TOPIC, partition_for(k, PARTS), [(k, v, ts, None)])
    log.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS views CASCADE")
        conn.execute("DROP SCHEMA IF EXISTS tributary_projections CASCADE")
    cfg = {
        "dsn": dsn,
        "root": str(root),
        "master": args.master,
        "partitions": 2,
        "freshness": args.freshness,
    }
    err = (work / f"runner-{rate}.err").open("w")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(cfg)], stdout=subprocess.PIPE, stderr=err, text=True
    )
    try:
        wait_caught_up(dsn, args.keys, 300)
        out = Written()
        stop = threading.Event()
        found: dict[str, Changes] = {}

        def sampler(name: str, read: Callable[[], dict[int, int]]) -> None:
            found[name] = sample(args.poll_ms / 1000, stop.is_set, read)

        threads = [
            threading.Thread(target=sampler, args=("view", view_versions(dsn))),
            threading.Thread(target=sampler, args=("log", log_ends(root))),
        ]
        for t in threads:
            t.start()
        load0 = os.getloadavg()
        paced_log_writes(log, rate, args.seconds, args.keys, args.tick_ms / 1000, out)
        total = len(out.events)
        last = out.events[-1]
        deadline = time.monotonic() + 60
        read = view_versions(dsn)
        while read().get(last[0], 0) < last[1] and time.monotonic() < deadline:
            time.sleep(0.05)  # the tail: until the view shows the last event (or a minute)
        stop.set()
        for t in threads:
            t.join()
        load1 = os.getloadavg()
    finally:
        log.close()
        proc.terminate()
        stdout, _ = proc.communicate(timeout=120)
        err.close()
    lat: dict[str, list[float]] = {"view": [], "log": []}
    missing = 0
    for key, version, part, offset, c in out.events:
        at = out.commits[c]
        v = first_seen(found["view"], key, version)
        g = first_seen(found["log"], part, offset + 1)
        if v is None or g is None:
            missing += 1
            continue
        lat["view"].append(v - at)
        lat["log"].append(g - at)
    view, base = summary(lat["view"]), summary(lat["log"])
    passes = json.loads(stdout.strip().splitlines()[-1])["passes"] if stdout.strip() else None
    return {
        "rate_events_per_s": rate,
        "events": total,
        "achieved_events_per_s": round(total / args.seconds),
        "commits": len(out.commits),
        "not_seen": missing,
        "view": view,
        "log": base,
        "view_vs_log_p50": round(view["p50_ms"] / max(base["p50_ms"], 0.1), 1),
        "view_vs_log_p99": round(view["p99_ms"] / max(base["p99_ms"], 0.1), 1),
        "runner_passes": passes,
        "load_avg_1m_before_after": [round(load0[0], 2), round(load1[0], 2)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100,1000", help="comma-separated events/s")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--tick-ms", type=float, default=10.0, help="the writer commits what is due this often")
    ap.add_argument("--poll-ms", type=float, default=10.0, help="both samplers read this often")
    ap.add_argument("--freshness", type=float, default=5.0, help="`--freshness` of the continuous run")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dsn", help="service database (default: an embedded cluster in --dir)")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "view_latency.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    work = args.dir or Path(tempfile.mkdtemp(prefix="tributary-bench-latency-"))
    cluster = None
    dsn = args.dsn
    if dsn is None:
        from tributary.api.devdb.embedded import EmbeddedPostgres

        cluster = EmbeddedPostgres(work / "pg")
        cluster.up()
        dsn = cluster.dsn()
    try:
        rates = [one_rate(int(r), args, dsn, work) for r in args.rates.split(",")]
        result = {
            "bench": "view_latency",
            "projection": NAME,
            "master": args.master,
            "cpus": os.cpu_count(),
            "seconds": args.seconds,
            "keys": args.keys,
            "tick_ms": args.tick_ms,
            "poll_ms": args.poll_ms,
            "freshness_s": args.freshness,
            "rates": rates,
            "timing": (
                "per event: first sampler reading that shows it minus the time the log writer's commit() "
                "returned; both samplers poll every poll_ms (their resolution); view: the account's "
                "last_version in views.account_balances; log: a LogView's committed end"
            ),
        }
        text = json.dumps(result, indent=2)
        print(text)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    finally:
        if cluster is not None:
            cluster.destroy()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
