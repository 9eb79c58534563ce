"""Column and row rules: what they cost a change, against the same generic path without rules.

    .venv/bin/python bench/rules.py                 # 200,000 changes per case, 5 repeats
    .venv/bin/python bench/rules.py --changes 50000 --repeat 3

Each case makes the records of the same parsed wal2json INSERT (or UPDATE) documents of a
7-column table (`envelope.envelopes_for`, the streaming generic path a table with rules takes;
parsing, the same for every case, is left out), and of snapshot rows (`SnapshotEncoder.encode` / `encode_ruled`); the
baseline is the same path without rules, in the same run. Prints one JSON document: medians in
µs per change, and the rules' cost (the difference). Pure CPU: no database.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from tributary.capture.decoding.lsn import Lsn
from tributary.capture.decoding.wal2json import Change, parse_message
from tributary.capture.records import envelope as env
from tributary.capture.records.rules import RuleSpec, TableRules

COLUMNS = [("id", "integer", 23), ("email", "text", 25), ("ssn", "text", 25), ("card", "text", 25)]
COLUMNS += [("bio", "text", 25), ("status", "text", 25), ("amount", "numeric", 1700)]
CASES = {
    "none": None,
    "mask+hash+exclude": RuleSpec(tables=("*.*",), exclude=("ssn",), mask=("card",), hash=("email",), hash_salt="s"),
    "hash only": RuleSpec(tables=("*.*",), hash=("email",), hash_salt="s"),
    "mask+hash+exclude+filter": RuleSpec(
        tables=("*.*",),
        exclude=("ssn",),
        mask=("card",),
        hash=("email",),
        hash_salt="s",
        row_filter="status = 'open' and amount >= 10",
    ),
}
CTX: dict[str, Any] = {"source_name": "shop", "db": "db", "lsn": Lsn(1), "tx_id": 7, "commit_ts_ms": 1, "now_ms": 2}


def _values(i: int) -> list[Any]:
    return [i, f"user{i}@example.org", f"{i:09d}", f"4111-{i:012d}", "a biography " * 4, "open", f"{i % 997}.50"]


def _document(i: int, action: str) -> bytes:
    cols = [{"name": n, "type": t, "typeoid": o, "value": v} for (n, t, o), v in zip(COLUMNS, _values(i), strict=True)]
    doc: dict[str, Any] = {"action": action, "schema": "public", "table": "customers", "columns": cols}
    doc["pk"] = [{"name": "id", "type": "integer", "typeoid": 23}]
    if action == "U":
        doc["identity"] = cols[:1]
    return orjson.dumps(doc)


def _stream(changes: list[Change], rules: TableRules | None) -> float:
    start = time.perf_counter()
    for change in changes:
        env.envelopes_for(change, rules=rules, key_columns=("id",), **CTX)
    return time.perf_counter() - start


def _parsed(docs: list[bytes]) -> list[Change]:
    """The documents parsed once: the cases time the envelopes, where the rules apply."""
    out = [parse_message(doc) for doc in docs]
    assert all(isinstance(c, Change) for c in out)
    return out  # type: ignore[return-value]


def _snapshot(rows: list[list[str | None]], rules: TableRules | None) -> float:
    encoder = env.SnapshotEncoder(
        schema="public",
        table="customers",
        columns=COLUMNS,
        primary_key=("id",),
        source_name="shop",
        db="db",
        lsn=Lsn(1),
        now_ms=1,
        rules=rules,
    )
    encode: Callable[[list[str | None]], Any] = encoder.encode if rules is None else encoder.encode_ruled
    start = time.perf_counter()
    for row in rows:
        encode(row)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    n = args.changes
    inserts = _parsed([_document(i, "I") for i in range(n)])
    updates = _parsed([_document(i, "U") for i in range(n)])
    rows = [[str(v) for v in _values(i)] for i in range(n)]
    times: dict[str, dict[str, list[float]]] = {name: {"insert": [], "update": [], "snapshot": []} for name in CASES}
    for _ in range(args.repeat):
        for name, spec in CASES.items():  # interleaved: the machine's load moves all cases alike
            rules = None if spec is None else TableRules(spec, ("id",))
            times[name]["insert"].append(_stream(inserts, rules) / n * 1e6)
            times[name]["update"].append(_stream(updates, rules) / n * 1e6)
            times[name]["snapshot"].append(_snapshot(rows, rules) / n * 1e6)
    result: dict[str, Any] = {"changes": n, "repeat": args.repeat, "us_per_change": {}, "rules_cost_us": {}}
    for name, parts in times.items():
        result["us_per_change"][name] = {part: round(statistics.median(v), 3) for part, v in parts.items()}
    base = result["us_per_change"]["none"]
    for name, medians in result["us_per_change"].items():
        if name != "none":
            result["rules_cost_us"][name] = {part: round(medians[part] - base[part], 3) for part in medians}
    text = json.dumps(result, indent=2)
    print(text)
    out = args.out or Path(__file__).parent / "results" / f"rules-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
