"""Sealed segments are read from Parquet copies, the active tail from row splits: same records.

The Parquet path computes event time and key as SQL expressions; the row path in Python
(`records.default_event_time`). Every awkward input below must come out identical both ways.
"""

from __future__ import annotations

from dataclasses import asdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from tributary.log.local import CorruptRecordError, Log, Split, TopicConfig, canonical_json, read_split
from tributary.log.local.codec import decode_line, encode_batch
from tributary.log.local.columnar import copy_format, decode_lines, is_current, read_split_columns
from tributary.log.local.segment import iter_lines
from tributary.projections.records import SCHEMA_KEY, default_event_time
from tributary.projections.source import RECORD_SCHEMA, _raw_rows, plan, records_frame

pytestmark = pytest.mark.integration

VALUES: list[Any] = [
    {"type": "Opened", "occurred_at": "2026-11-23T09:00:00.123456Z"},
    {"type": "Opened", "occurred_at": "2026-11-23T09:00:00+02:00"},
    {"type": "Opened", "occurred_at": "2026-11-23T09:00:00"},  # no zone: UTC
    {"type": "Opened", "occurred_at": "1969-12-31T23:59:59.9995Z"},  # before 1970: floor, not truncate
    {"type": "Opened", "occurred_at": "2026-11-23T09:00:00.1+00:00"},
    {"type": "Opened", "occurred_at": 12345},  # not a string: log time
    {"type": "Opened"},  # none: log time
    None,  # tombstone
    {"op": "c", "source": {"ts_ms": 1795424400999}, "ts_ms": 1},
    {"op": "u", "source": {"lsn": "0/1"}, "ts_ms": 1795424400777},
    {"op": "d", "source": {"ts_ms": "12"}, "ts_ms": 2.5},  # not integers: log time
    {"op": "c"},
    {"op": "u", "source": {"ts_ms": None}, "ts_ms": 7},  # a small integer (stored narrower)
    {"op": "u", "source": {"ts_ms": True}},  # not an integer in JSON
    [1, 2, 3],
    # exact values: money as a string and as numbers with trailing zeros / 29 significant digits
    b'{"type":"Paid","data":{"amount":"12.50","n":12345678901234567890.123456789,"z":1.10}}',
]
TOPICS = ("events.thing", "shop.public.thing")


def _write(root: Path) -> Log:
    log = Log.open(root, writer=True, segment_bytes=4096)
    for topic in TOPICS:
        log.create_topic(topic, TopicConfig(partitions=2))
    ts = 1_700_000_000_000
    for round_ in range(12):  # enough bytes to seal several segments per partition
        for topic in TOPICS:
            for i, value in enumerate(VALUES):
                key = canonical_json({"id": i}) if i % 3 else canonical_json(f"k{i}")
                part = log.partition_for(topic, key)
                body = value if value is None or isinstance(value, bytes) else orjson.dumps(value)
                log.append(topic, part, [(key, body, ts + round_ * 100 + i, None)])
        log.commit()
    return log


PROJECTION_FILE = f"""
from tributary.projections.definition import Projection, Table
PROJECTION = Projection(
    name="cols", version=1, topics={TOPICS!r}, table=Table.of({{"k": "text"}}, ["k"]), build=lambda df: df,
)
"""


def _module(tmp_path: Path) -> str:
    module = tmp_path / "cols.py"
    module.write_text(PROJECTION_FILE)
    return str(module)


def test_parquet_and_row_paths_give_identical_records(spark: Any, tmp_path: Path) -> None:
    log = _write(tmp_path / "log")
    ends = {(t, p): e.end for (t, p), e in log.ends().items()}
    rows, sealed = plan(log, TOPICS, {}, ends, 1 << 20)
    assert sealed and rows, "the test needs sealed segments and an active tail"

    frame = records_frame(
        spark, log, modules=[_module(tmp_path)], mirror=[], name="cols", topics=TOPICS, lo={}, hi=ends
    )
    assert all(copy_format(Path(s.path).parent, s.base) == 2 for s in sealed), "copies of the sealed segments were made"
    names = [c.split()[0] for c in RECORD_SCHEMA.split(", ")]
    got = sorted(tuple(r) for r in frame.select(*names).collect())

    # The oracle: every committed record read row by row, with Python's event time and key.
    want = []
    for topic in TOPICS:
        for part in range(2):
            for rec in log.read(topic, part, 0):
                value = None if rec.value is None else rec.value.decode()
                event_time = default_event_time(topic, None if value is None else orjson.loads(value), rec.timestamp)
                key = None if rec.key is None else rec.key.decode()
                want.append((topic, part, rec.offset, rec.timestamp, key, value, None, event_time, key or "null"))
    assert got == sorted(want)
    assert [f.name for f in frame.schema.fields] == [*names, "value_v"]


def test_offsets_inside_sealed_segments_are_honoured(spark: Any, tmp_path: Path) -> None:
    """A run starting in the middle of a sealed segment reads from exactly its checkpoint."""
    log = _write(tmp_path / "log")
    ends = {(t, p): e.end for (t, p), e in log.ends().items()}
    lo = {tp: end // 3 for tp, end in ends.items()}
    hi = {tp: 2 * end // 3 for tp, end in ends.items()}
    frame = records_frame(spark, log, modules=[_module(tmp_path)], mirror=[], name="cols", topics=TOPICS, lo=lo, hi=hi)
    got = sorted((r["topic"], r["partition"], r["offset"]) for r in frame.collect())
    want = sorted((t, p, o) for (t, p), end in ends.items() for o in range(lo[(t, p)], hi[(t, p)]))
    assert got == want


def _variant_view(frame: Any) -> list[tuple[Any, ...]]:
    """Each record's VARIANT value as JSON text, plus the exact-decimal reads a projection does."""
    from pyspark.sql import functions as F

    return sorted(
        tuple(r)
        for r in frame.select(
            "topic",
            "partition",
            "offset",
            "value",
            F.to_json("value_v"),
            F.expr("try_variant_get(value_v, '$.data.amount', 'decimal(20,2)')"),
            F.expr("try_variant_get(value_v, '$.data.n', 'decimal(38,9)')"),
            F.expr("try_variant_get(value_v, '$.data.z', 'decimal(10,2)')"),
        ).collect()
    )


def test_variant_value_is_the_same_from_parquet_and_rows(spark: Any, tmp_path: Path) -> None:
    """`value_v` (shredded VARIANT in the copies, parsed for the tail) holds each value exactly."""
    log = _write(tmp_path / "log")
    ends = {(t, p): e.end for (t, p), e in log.ends().items()}
    active = {tp: e.segment for tp, e in log.ends().items()}  # offsets below: sealed (Parquet)
    frame = records_frame(
        spark, log, modules=[_module(tmp_path)], mirror=[], name="cols", topics=TOPICS, lo={}, hi=ends
    )
    got = _variant_view(frame)
    assert len(got) == sum(ends.values())
    paid = set()
    for topic, part, off, value, as_json, amount, n, z in got:
        if value is None:
            assert as_json is None
            continue
        assert orjson.loads(as_json) == orjson.loads(value)
        if '"Paid"' in value:
            assert (amount, n, z) == (Decimal("12.50"), Decimal("12345678901234567890.123456789"), Decimal("1.10"))
            paid.add(off < active[(topic, part)])
    assert paid == {True, False}, "the exact values were read from both paths"


def test_older_copies_are_remade_and_stale_ones_refused(spark: Any, tmp_path: Path) -> None:
    """Format-1 copies (pyarrow, JSON text only: `Log.write_parquet`, older versions) are
    rewritten in format 2 by the next run; a copy made from other bytes is not current."""
    log = _write(tmp_path / "log")
    ends = {(t, p): e.end for (t, p), e in log.ends().items()}
    _, sealed = plan(log, TOPICS, {}, ends, 1 << 20)
    assert log.write_parquet() == len(sealed)
    assert {copy_format(Path(s.path).parent, s.base) for s in sealed} == {1}
    frame = records_frame(
        spark, log, modules=[_module(tmp_path)], mirror=[], name="cols", topics=TOPICS, lo={}, hi=ends
    )
    assert frame.count() == sum(ends.values())
    assert {copy_format(Path(s.path).parent, s.base) for s in sealed} == {2}
    a = sealed[0]
    b = next(s for s in sealed if Path(s.path).stat().st_size != Path(a.path).stat().st_size)
    b.copy_path.write_bytes(a.copy_path.read_bytes())
    assert copy_format(Path(b.path).parent, b.base) is None and not is_current(Path(b.path).parent, b.base)


# Values and headers that look like the line format inside JSON strings, non-ASCII text, escapes.
AWKWARD = [
    (canonical_json("a"), b'{"x":"\\","crc":1}","lens":[1,2,3]}', b'{"h":"\xc3\xa9\xe2\x82\xac"}'),
    (None, b'"null"', None),  # a null key; the JSON string "null" is not a null value
    (canonical_json({"id": "\u00e9"}), None, b"[]"),  # tombstone with headers
    (canonical_json("b"), b"null", b"null"),  # spliced JSON null: read back as None
    (canonical_json("c"), b"12345678901234567890123", b"{}"),
    (canonical_json("d"), b'{"occurred_at":"2026-11-23T09:00:00Z","s":"\\n\\"{\\"offset\\":1}"}', None),
]


def _rows_of(split: Split, lo: int, hi: int) -> list[tuple[Any, ...]]:
    def text(b: bytes | None) -> str | None:
        return None if b is None else b.decode()

    return [
        (r.offset, r.timestamp, text(r.key), text(r.value), text(r.headers))
        for r in read_split(split)
        if lo <= r.offset < hi
    ]


def _awkward_log(root: Path) -> Log:
    log = Log.open(root, writer=True, segment_bytes=2048)
    log.create_topic("events.x", TopicConfig(partitions=1))
    for round_ in range(8):
        log.append("events.x", 0, [(k, v, -5 + round_ * 1000 + i, h) for i, (k, v, h) in enumerate(AWKWARD)])
        log.commit()
    return log


def test_split_columns_equal_the_row_reader(tmp_path: Path) -> None:
    """`read_split_columns` (the tail's whole-split decoder) gives read_split's records exactly,
    for every split (sealed and active) and offset bounds inside, at and beyond them."""
    log = _awkward_log(tmp_path / "log")
    splits = log.splits("events.x", max_bytes=700)
    assert len(splits) >= 3  # sealed segments and the active one
    end = log.ends()[("events.x", 0)].end
    checked = 0
    for split in splits:
        for lo, hi in [(0, end), (split.first_offset + 1, end), (0, split.first_offset + 2), (end, end + 1)]:
            table = read_split_columns(split, lo, hi)
            assert table is not None
            got = list(zip(*(table[c].to_pylist() for c in table.column_names), strict=True))
            assert got == _rows_of(split, lo, hi)
            checked += len(got)
    assert checked > len(AWKWARD) * 8


def _lines(path: Path) -> list[bytes]:
    return [line for _, line in iter_lines(path)]


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b.replace(b',"crc":', b',"crc":9', 1),  # wrong CRC
        lambda b: b.replace(b'"lens":[', b'"lens":[1', 1),  # lengths not matching the fields
        lambda b: b.replace(b',"value":', b',"valeu":', 1),
        lambda b: b.replace(b'{"offset":', b'{"offset":x', 1),
        lambda b: b.replace(b"\n", b"\n\n", 1),  # an empty line
        lambda b: b + encode_batch(99, [(b'"k"', b'"\xc3\x28"', 1, None)])[0],  # not UTF-8, CRC right
    ],
)
def test_damaged_lines_are_left_to_the_row_reader(tmp_path: Path, damage: Any) -> None:
    """Whatever the row path refuses, the whole-split decoder refuses too (returns None), so the
    reader falls back to `read_split`, whose error names the record."""
    log = _awkward_log(tmp_path / "log")
    split = log.splits("events.x", max_bytes=1 << 20)[0]
    data = Path(split.path).read_bytes()[split.start_byte : split.end_byte]
    assert decode_lines(data) is not None
    bad = damage(data)
    assert bad != data
    assert decode_lines(bad) is None
    with pytest.raises(ValueError):  # the row path's checks on the same bytes
        for line in bad.split(b"\n")[:-1]:
            decode_line(line)
            line.decode()


def test_tail_reader_falls_back_and_reports_corruption(tmp_path: Path) -> None:
    """A changed file (its line at start_byte no longer claims first_offset) or a corrupt line:
    the columnar path declines; `_raw_rows` then reads by offset, or raises the row path's error."""
    log = _awkward_log(tmp_path / "log")
    split = log.splits("events.x", max_bytes=1 << 20)[-1]  # the active segment
    end = log.ends()[("events.x", 0)].end
    row = {**asdict(split), "lo": 0, "hi": end}

    def read(r: dict[str, Any]) -> list[tuple[Any, ...]]:
        out = []
        for b in _raw_rows(iter([pa.RecordBatch.from_pylist([r])])):
            out += list(zip(*(b[c].to_pylist() for c in b.schema.names), strict=True))
        return out

    want = [(split.topic, split.partition, *r) for r in _rows_of(split, 0, end)]
    assert read(row) == want
    moved = {**row, "start_byte": row["start_byte"] + 1}  # planned bytes that no longer line up: by offset
    assert read_split_columns(Split(**asdict(split) | {"start_byte": split.start_byte + 1}), 0, end) is None
    assert read(moved) == want
    path = Path(split.path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b',"crc":', b',"crc":9', 3))
    with pytest.raises(CorruptRecordError, match="CRC"):
        read(row)


def _read_schemas(frame: Any, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The `ReadSchema` of each Parquet scan in the frame's physical plan."""
    capsys.readouterr()
    frame.explain()
    return [line.split("ReadSchema: ", 1)[1] for line in capsys.readouterr().out.splitlines() if "ReadSchema: " in line]


def test_schema_records_are_filtered_only_in_copies_that_may_hold_them(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CDC topic's copies still drop its schema records; an event topic's copies (their keys
    are JSON strings, below the schema key) need no key filter, so a projection reading only
    the value never decodes their key column."""
    from pyspark.sql import functions as F

    log = Log.open(tmp_path / "log", writer=True, segment_bytes=4096)
    for topic in TOPICS:
        log.create_topic(topic, TopicConfig(partitions=1))
    schema = orjson.dumps({"schema": {"columns": [{"name": "id", "type": "integer", "typeoid": 23}]}, "ts_ms": 1})
    log.append(TOPICS[1], 0, [(SCHEMA_KEY.encode(), schema, 1, None)])
    for i in range(300):  # several sealed segments per topic
        log.append(TOPICS[0], 0, [(canonical_json(f"s{i % 7}"), orjson.dumps({"type": "Opened", "n": i}), i, None)])
        row = {"op": "c", "after": {"id": i}, "source": {"ts_ms": i}}
        log.append(TOPICS[1], 0, [(canonical_json({"id": i}), orjson.dumps(row), i, None)])
    log.commit()
    ends = {(t, p): e.end for (t, p), e in log.ends().items()}
    frame = records_frame(
        spark, log, modules=[_module(tmp_path)], mirror=[], name="cols", topics=TOPICS, lo={}, hi=ends
    )
    _, sealed = plan(log, TOPICS, {}, ends, 1 << 20)
    assert {s.topic for s in sealed} == set(TOPICS), "the test needs copies of both topics"

    got = frame.select("topic", "key").collect()
    assert SCHEMA_KEY not in {r["key"] for r in got}
    assert len(got) == 600
    schemas = _read_schemas(frame.select(F.expr("variant_get(value_v, '$.type', 'string')")), capsys)
    assert len(schemas) == 2
    assert sorted("key:" in s for s in schemas) == [False, True], schemas
