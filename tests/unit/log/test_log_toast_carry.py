"""Unchanged-TOAST placeholders under compaction: the pure rules (`placeholders`), and the law on
real files — after any history of upserts (columns real, null, absent or the placeholder),
deletes, tombstones, segment rolls and compactions, the compacted partition's fold equals the
uncompacted one's with placeholders resolved from earlier values, and a compacted key's latest
record holds every value it can."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tributary.capture.decoding.values import UNAVAILABLE
from tributary.log.local import Log, Record, TopicConfig, admin, canonical_json
from tributary.log.local.cleaner import read_checkpoint
from tributary.log.local.codec import encode_batch
from tributary.log.local.columnar import is_current
from tributary.log.local.placeholders import PLACEHOLDER, fill, holes, observe

pytestmark = pytest.mark.unit

PH = PLACEHOLDER
ABSENT = object()  # the column is not in the row (dropped by a schema change)
RETENTION = 40  # delete_retention_ms


def envelope(after: dict[str, Any] | None, op: str = "u") -> bytes:
    return orjson.dumps({"before": None, "after": after, "source": {"lsn": 1}, "op": op, "ts_ms": 5})


# -- the pure rules ----------------------------------------------------------------------------------


def test_the_log_and_capture_agree_on_the_placeholder() -> None:
    assert PLACEHOLDER == UNAVAILABLE


def test_holes_are_after_columns_holding_the_placeholder_exactly() -> None:
    assert holes(envelope({"id": 1, "a": PH, "b": "x", "c": PH})) == {"a", "c"}
    assert holes(envelope({"id": 1, "a": PH + " "})) == frozenset()
    assert holes(b'{"before":{"a":"' + PH.encode() + b'"},"after":{"a":"x"},"op":"u"}') == frozenset()
    assert holes(None) == holes(b"not json " + PH.encode()) == holes(envelope(None, "d")) == frozenset()
    assert holes(b'{"id":"' + PH.encode() + b'"}') == frozenset()  # an event, not an envelope


def test_fill_splices_the_value_and_keeps_every_other_byte() -> None:
    raw = (
        b'{"before":null,"after":{"id":1,"num":"12345678901234567890.120","j":{"x":1.10,"y":[1e400]},'
        b'"a": "' + PH.encode() + b'","z":"\\u00e9"},"source":{},"op":"u","ts_ms":5}'
    )
    carry: dict[str, bytes] = {}
    source = b'{"after":{"a":"big \\"value\\" \xc3\xa9","j":{"x":1.10}},"op":"r"}'
    observe(carry, source, holes(raw))
    assert carry == {"a": source}
    out = fill(raw, carry)
    assert out == raw.replace(b'"' + PH.encode() + b'"', b'"big \\"value\\" \xc3\xa9"')
    assert fill(raw, carry, pad=True) == out.replace(b'"a": "big', b'"a":  "big')
    assert fill(raw, {}) is raw and fill(b"null", carry) == b"null"


def test_observe_resets_on_deletes_and_tombstones_and_never_resurrects_a_dropped_column() -> None:
    cols = frozenset({"a"})
    carry: dict[str, bytes] = {}
    observe(carry, envelope({"a": "v1"}), cols)
    observe(carry, envelope({"a": PH}), cols)
    assert carry == {"a": envelope({"a": "v1"})}
    observe(carry, envelope({"b": 1}), cols)  # the column was dropped
    assert carry == {}
    observe(carry, envelope({"a": "v2"}), cols)
    observe(carry, envelope(None, "d"), cols)
    assert carry == {}
    observe(carry, envelope({"a": "v3"}), cols)
    observe(carry, None, cols)
    assert carry == {}
    observe(carry, envelope({"a": None}), cols)  # a real null, as the row had it
    assert carry == {"a": envelope({"a": None})}
    assert fill(envelope({"a": PH}), carry) == envelope({"a": None})
    huge = b'{"after":{"a":1e400,"b":"' + PH.encode() + b'"}}'  # beyond a double: still read
    assert holes(huge) == {"b"} and fill(huge, {"b": huge.replace(b'"' + PH.encode() + b'"', b"[2e999]")}) == (
        b'{"after":{"a":1e400,"b":[2e999]}}'
    )


# -- the law, on real files ---------------------------------------------------------------------------

_real = st.integers(1, 40).map(lambda n: "v" * n)
_a = st.sampled_from([PH, PH, None, ABSENT]) | _real | _real  # mostly placeholders and real values
_upsert = st.tuples(st.just("upsert"), st.integers(0, 3), _a, st.sampled_from([PH, "1", "2"]))
_change = st.one_of(_upsert, _upsert, _upsert, st.tuples(st.sampled_from(["delete", "tombstone"]), st.integers(0, 3)))
_ops = st.one_of(
    st.tuples(st.just("append"), st.lists(_change, min_size=1, max_size=8)),
    st.tuples(st.just("compact"), st.integers(0, 60)),
)
_FILLER = [("upsert", 99, "p" * 300, "1")] * 2  # another key's records: what came before gets sealed


def _records(change: tuple[Any, ...], seq: int) -> list[tuple[bytes, bytes | None]]:
    key = canonical_json({"id": change[1]})
    if change[0] == "delete":
        return [(key, envelope(None, "d")), (key, None)]
    if change[0] == "tombstone":
        return [(key, None)]
    after: dict[str, Any] = {"id": change[1], "n": seq, "b": change[3]}
    if change[2] is not ABSENT:
        after["a"] = change[2]
    return [(key, envelope(after))]


def _resolved(records: list[tuple[int, bytes, bytes | None]]) -> dict[int, dict[str, Any] | None]:
    """The oracle: each offset's row with placeholders resolved from the key's earlier rows (a
    delete or a tombstone forgets the row; a column a row lacks is gone)."""
    rows: dict[bytes, dict[str, Any] | None] = {}
    out: dict[int, dict[str, Any] | None] = {}
    for off, key, value in records:
        after = None if value is None else orjson.loads(value)["after"]
        if after is not None:
            prev = rows.get(key) or {}
            after = {c: (prev[c] if v == PH and c in prev else v) for c, v in after.items()}
        rows[key] = out[off] = after
    return out


def _fold(records: list[tuple[int, bytes, bytes | None]]) -> dict[bytes, dict[str, Any]]:
    at = _resolved(records)
    state: dict[bytes, dict[str, Any] | None] = {}
    for off, key, _value in records:
        state[key] = at[off]
    return {k: v for k, v in state.items() if v is not None}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ops, min_size=2, max_size=14))
def test_compaction_keeps_the_fold_and_fills_what_it_keeps(history: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "log"
        model: list[tuple[int, bytes, bytes | None]] = []
        ts = now = 0
        with Log.open(root, writer=True, segment_bytes=400, index_interval_bytes=100) as log:
            log.create_topic("c", TopicConfig(partitions=1, policy="compact", delete_retention_ms=RETENTION))
            for op in [*history, ("compact", 0), ("append", _FILLER), ("compact", 0)]:  # at last all compactable
                if op[0] == "append":
                    batch = []
                    for change in op[1]:
                        for key, value in _records(change, len(model)):
                            ts += 1
                            model.append((len(model), key, value))
                            batch.append((key, value, ts, None))
                    log.append("c", 0, batch)
                    log.commit()
                    continue
                now = max(now, ts + op[1])
                log.compact(now_ms=now)
                _check(log, root, model)
            assert log.verify() == []


def _check(log: Log, root: Path, model: list[tuple[int, bytes, bytes | None]]) -> None:
    got = list(log.read("c", 0))
    original = {off: value for off, _k, value in model}
    at = _resolved(model)
    for r in got:  # nothing invented: each value as written, or with placeholders filled as resolved
        assert r.offset in original
        if r.value is None or r.value == original[r.offset]:
            continue
        mine, theirs = orjson.loads(r.value), orjson.loads(original[r.offset])  # type: ignore[arg-type]
        assert {k: v for k, v in mine.items() if k != "after"} == {k: v for k, v in theirs.items() if k != "after"}
        for c, v in theirs["after"].items():
            assert mine["after"][c] == v or (v == PH and mine["after"][c] == at[r.offset][c]), (r.offset, c)  # type: ignore[index]
    log_records = [(r.offset, r.key, r.value) for r in got]
    assert _fold(log_records) == _fold(model)
    # a key whose latest record a pass compacted holds every value that can be known
    clean_end = read_checkpoint(root)["partitions"]["c/0"]["clean_end"]
    last: dict[bytes, int] = {}
    for off, key, _v in model:
        last[key] = off
    raw = {r.key: r for r in got}
    for key, off in last.items():
        if off < clean_end and original[off] is not None:
            assert raw[key].offset == off and orjson.loads(raw[key].value or b"null")["after"] == at[off]
    # `log cat --compacted` shows the same rows, before and after compaction
    whole = [Record("c", 0, off, 0, key, value, None) for off, key, value in model]
    for records in (got, whole):
        shown = {r.key: orjson.loads(r.value)["after"] for r in admin.latest_per_key(records) if r.value is not None}
        assert shown == _fold(model)


# -- across passes, and the Parquet copies ------------------------------------------------------------

K = canonical_json({"id": 1})


def _values(log: Log) -> list[tuple[int, bytes | None, Any]]:
    return [(r.offset, r.key, r.value and orjson.loads(r.value)["after"]) for r in log.read("c", 0)]


def test_a_value_is_carried_across_passes_while_the_latest_record_is_not_yet_compactable(tmp_path: Path) -> None:
    big = "x" * 300
    with Log.open(tmp_path / "log", writer=True, segment_bytes=400, index_interval_bytes=100) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        log.append("c", 0, [(K, envelope({"id": 1, "n": 0, "a": big}), 1, None)])  # its own segment
        log.append("c", 0, [(K, envelope({"id": 1, "n": i, "a": PH}), 1 + i, None) for i in range(1, 5)])
        log.commit()
        log.compact(now_ms=10)
        # pass 1: the latest record (n=4) is in the active segment; the last sealed one carries the value
        got = _values(log)
        assert got[-1][2] == {"id": 1, "n": 4, "a": PH}
        assert [a for _o, _k, a in got[:-1]] == [{"id": 1, "n": 3, "a": big}]
        # pass 2, once the latest is sealed: it holds the value, the carrier is gone
        other = canonical_json({"id": 2})
        log.append("c", 0, [(other, envelope({"id": 2, "n": 0, "pad": "p" * 300}), 9, None)] * 2)
        log.commit()
        log.compact(now_ms=20)
        assert [(o, k, a) for o, k, a in _values(log) if k == K] == [(4, K, {"id": 1, "n": 4, "a": big})]
        # pass 3: the filled record is the kept record of a pass; newer placeholders get it from there
        log.append("c", 0, [(K, envelope({"id": 1, "n": 5, "a": PH}), 10, None)])
        log.append("c", 0, [(other, envelope({"id": 2, "n": 1, "pad": "p" * 300}), 11, None)] * 2)
        log.commit()
        log.compact(now_ms=30)
        assert [(o, k, a) for o, k, a in _values(log) if k == K] == [(7, K, {"id": 1, "n": 5, "a": big})]
        assert log.verify() == []


def _line(off: int, key: bytes, value: bytes, ts: int) -> int:
    return len(encode_batch(off, [(key, value, ts, None)])[0])


def test_a_rewritten_segment_never_keeps_its_size_so_an_old_parquet_copy_looks_stale(tmp_path: Path) -> None:
    x, y = canonical_json({"id": 7}), canonical_json({"id": 8})
    kept = envelope({"id": 1, "a": PH})
    # sized so that filling `kept` grows it by exactly the bytes of the record dropped beside it
    n, pad = next(
        (n, pad)
        for n in range(40, 400)
        for pad in range(0, 40)
        if _line(1, K, fill(kept, {"a": envelope({"a": "v" * n})}), 100)
        == _line(1, K, kept, 100) + _line(2, x, envelope({"id": 7, "pad": "p" * pad}), 100)
    )
    records = [
        (K, envelope({"id": 1, "a": "v" * n}), 0),  # segment 0: the value, dropped
        (K, kept, 100),  # segment 1: kept and filled ...
        (x, envelope({"id": 7, "pad": "p" * pad}), 100),  # ... while this one is dropped
        (x, envelope({"id": 7}), 200),  # segment 2
        (y, envelope({"id": 8}), 300),  # the active segment
    ]
    with Log.open(tmp_path / "log", writer=True, segment_ms=10) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        for key, value, ts in records:
            log.append("c", 0, [(key, value, ts, None)])
        log.commit()
        pdir = tmp_path / "log" / "c" / "0"
        assert log.write_parquet("c") == 3 and is_current(pdir, 1)
        size = (pdir / f"{1:020d}.log").stat().st_size
        log.compact(now_ms=1_000)
        assert [(o, a) for o, k, a in _values(log) if k == K] == [(1, {"id": 1, "a": "v" * n})]
        assert (pdir / f"{1:020d}.log").stat().st_size == size + 1  # one byte of padding
        assert not is_current(pdir, 1)  # the old copy is recognisably stale, and is made again
        assert log.write_parquet("c") == 1
        rows = pq.read_table(pdir / f"{1:020d}.parquet").to_pylist()
        assert [(r["offset"], orjson.loads(r["value"])["after"]["a"]) for r in rows] == [(1, "v" * n)]


def _grown_layout() -> list[tuple[bytes, bytes, int]]:
    """Records (key, value, ts; one segment per ts) where compaction fills K's record in the
    segment at ts 100 and drops the one after it, so that the filled record ends exactly where
    the segment's old bytes up to offset 4 ended: offset 4 now lies beyond them."""
    a, x, z, y = (canonical_json({"id": i}) for i in (5, 7, 9, 8))
    kept = envelope({"id": 1, "a": PH})
    n, pad = next(
        (n, pad)
        for n in range(40, 600)
        for pad in range(0, 40)
        if _line(2, K, fill(kept, {"a": envelope({"a": "v" * n})}), 100)
        == _line(2, K, kept, 100)
        + _line(3, x, envelope({"id": 7, "pad": "p" * pad}), 100)
        + _line(4, z, envelope({"id": 9}), 100)
    )
    return [
        (K, envelope({"id": 1, "a": "v" * n}), 0),  # segment 0: the value, dropped
        (a, envelope({"id": 5}), 100),  # segment 1: kept as it is
        (K, kept, 100),  # kept and filled
        (x, envelope({"id": 7, "pad": "p" * pad}), 100),  # dropped
        (z, envelope({"id": 9}), 100),  # kept, beyond the old bytes once K's record grew
        (x, envelope({"id": 7}), 200),  # segment 2
        (y, envelope({"id": 8}), 300),  # the active segment
    ]


def test_a_split_planned_before_a_record_grew_still_reads_every_offset_of_its_range(tmp_path: Path) -> None:
    from tributary.log.local import read_split, read_split_columns

    with Log.open(tmp_path / "log", writer=True, segment_ms=10) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        for key, value, ts in _grown_layout():
            log.append("c", 0, [(key, value, ts, None)])
        log.commit()
        split = next(s for s in log.splits("c") if s.first_offset == 1)
        assert split.end_offset == 5
        log.compact(now_ms=1_000)
    assert [r.offset for r in read_split(split)] == [1, 2, 4]
    table = read_split_columns(split, 0, 1 << 40)
    assert table is None or table["offset"].to_pylist() == [1, 2, 4]


def test_a_reader_that_took_a_since_grown_segment_for_the_active_one_reads_all_of_it(tmp_path: Path) -> None:
    records = _grown_layout()
    with Log.open(tmp_path / "log", writer=True, segment_ms=10) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        for key, value, ts in records[:5]:
            log.append("c", 0, [(key, value, ts, None)])
        log.commit()
        with Log.open(tmp_path / "log") as reader:  # its manifest: segment 1 active, offsets < 5
            for key, value, ts in records[5:]:
                log.append("c", 0, [(key, value, ts, None)])
            log.commit()
            log.compact(now_ms=1_000)
            assert [r.offset for r in reader.read("c", 0)] == [1, 2, 4]
