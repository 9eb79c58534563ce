"""The columnar snapshot (capture/snapshot/columnar.py + codec_arrow) against the row path, on the
real server: the same key, value, headers, partition, offset and timestamp for every record."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tributary.capture import compiled
from tributary.capture.database.catalog import list_tables
from tributary.capture.database.replication import connect_options
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.records import envelope as env
from tributary.capture.snapshot import columnar
from tributary.capture.snapshot.initial import SnapshotSource
from tributary.capture.snapshot.reader import SnapshotReader
from tributary.capture.source import SourceSession, SourceSpec
from tributary.log.local import Log
from tributary.log.local.codec import RecordIn, encode_batch
from tributary.log.local.codec_arrow import encode_columns
from tributary.log.local.partitioner import partition_for

pytestmark = pytest.mark.integration

_COLUMNS = (
    'id bigint, "k ey" text, a int, b text, c timestamptz, ts timestamp, n numeric, ok bool, '
    "by bytea, u uuid, d date, i interval, s smallint"
)
_KEY = 'PRIMARY KEY (id, "k ey")'
_LSN = re.compile(rb'"lsn":\d+')
_INSERT = "INSERT INTO {t} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"

_text = st.lists(
    st.one_of(
        st.sampled_from(list('\\"\t\n\r\b\f\v\x01\x1f\x7f/ \u2028é😀N') + ["\\N", "\\v", '\\"', "\ufeff"]),
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    ),
    max_size=8,
).map("".join)
_stamp = st.datetimes(
    min_value=dt.datetime(1, 1, 1),
    max_value=dt.datetime(9999, 12, 31),
    timezones=st.sampled_from(
        [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-11))]
    ),
)
_row = st.tuples(
    st.integers(-(2**63), 2**63 - 1),
    _text,
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    st.one_of(st.none(), _text),
    st.one_of(st.none(), _stamp, st.sampled_from(["infinity", "-infinity", "0044-03-15 12:00:00+00 BC"])),
    st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1, 1, 1)), st.just("-infinity")),
    st.one_of(
        st.none(),
        st.decimals(min_value=-(10**20), max_value=10**20, places=12).map(str),
        st.sampled_from(["NaN", "1e-30", "-0", "12345678901234567890.123456789012345678901234567890"]),
    ),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.binary(max_size=6)),
    st.one_of(st.none(), st.uuids().map(str)),
    st.one_of(st.none(), st.dates(), st.just("-infinity")),
    st.one_of(st.none(), st.sampled_from(["1 year 2 mons -3 days 04:05:06.7", "0", "-00:00:00.000001"])),
    st.one_of(st.none(), st.integers(-(2**15), 2**15 - 1)),
)


def _load(dsn: str, table: str, rows: list[tuple[object, ...]], *, timezone: str = "UTC") -> None:
    seen: set[tuple[object, object]] = set()
    unique = [r for r in rows if (r[0], r[1]) not in seen and not seen.add((r[0], r[1]))]  # type: ignore[func-returns-value]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET TimeZone = '{timezone}'")
        conn.execute(f"DROP TABLE IF EXISTS {table}; CREATE TABLE {table} ({_COLUMNS}, {_KEY})")
        with conn.cursor() as cur:
            cur.executemany(_INSERT.format(t=table), unique)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, min_size=1, max_size=40), chunk_bytes=st.sampled_from([1, 300, 1 << 20]))
def test_columnar_records_equal_the_row_path(fresh_db: str, rows: list[tuple[object, ...]], chunk_bytes: int) -> None:
    _load(fresh_db, "prop", rows)
    with psycopg.connect(fresh_db, autocommit=True, **connect_options()) as conn:
        (table,) = list_tables(conn, lambda s, t: t == "prop")
    holder = psycopg.connect(fresh_db, **connect_options())
    try:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        snap = holder.execute("SELECT pg_export_snapshot()").fetchone()
        assert snap is not None
        with SnapshotReader(fresh_db, snap[0], label="t") as reader:
            columns = [(c.name, c.type, c.typeoid) for c in table.columns]
            encoder = env.SnapshotEncoder(
                schema="public",
                table="prop",
                columns=columns,
                primary_key=table.identity_columns,
                source_name="shop",
                db="db",
                lsn=Lsn(7),
                now_ms=5,
            )
            plan = columnar.plan([(c[0], c[1]) for c in columns], table.identity_columns)
            assert plan is not None
            by_columns: dict[int, list[bytes]] = {p: [] for p in range(3)}
            for chunk in reader.text_chunks(table, chunk_bytes=chunk_bytes):
                recs = columnar.encode_chunk(plan, chunk, 3)
                for p in range(3):
                    sel = columnar.rows_of(recs.partitions, p)
                    if not len(sel):
                        continue
                    args = columnar.value_args(plan, recs, sel)
                    args.append(columnar.scalar(b"}" + encoder.tail("true")))
                    data, sizes = encode_columns(len(by_columns[p]), 5, recs.keys.take(sel), args)
                    assert sizes == [len(line) + 1 for line in data.splitlines()]
                    by_columns[p] += data.splitlines()
            staged: dict[int, list[RecordIn]] = {p: [] for p in range(3)}
            for values in reader.rows(table):
                out = encoder.encode(values)
                staged[partition_for(out.key, 3)].append((out.key, out.value, 5, None))
    finally:
        holder.close()
    by_rows = {p: encode_batch(0, records)[0].splitlines() for p, records in staged.items()}
    assert by_columns == by_rows


def _snapshot_log(
    dsn: str, root: Path, slot: str, *, columnar: bool
) -> list[tuple[str, int, int, int, bytes | None, bytes | None, bytes | None]]:
    """The snapshot's log: `columnar` through the session (the product's choice of path per
    table), else every table down the per-row path (`SnapshotSource(columnar=False)`)."""
    spec = SourceSpec(
        name="shop", dsn=dsn, slot=slot, include=("public.*",), exclude=(), snapshot="initial", partitions=3
    )
    progress: list[int] = []
    with Log.open(root, writer=True, fsync=False) as log_:
        session = SourceSession(spec, log_, clock=lambda: 1_700_000_000.0)
        try:
            if columnar:
                session.open(on_progress=lambda s: progress.append(s.snapshot_rows_done))
            else:
                state = session.slot.inspect()
                rowwise = SnapshotSource(
                    spec,
                    session.staging,
                    session.tables,
                    session.status,
                    db=state.database,
                    clock=session.clock,
                    columnar=False,
                )
                rowwise.take(session.slot, state, on_progress=lambda s: progress.append(s.snapshot_rows_done))
        finally:
            session.close()
        log_.commit()
        out = []
        for topic in sorted(log_.topics()):
            for p in range(log_.topics()[topic].partitions):
                out += [(topic, p, r.offset, r.timestamp, r.key, r.value, r.headers) for r in log_.read(topic, p, 0)]
    assert progress and progress[-1] == session.status.snapshot_rows_done
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return out


def test_snapshot_through_the_session_is_byte_identical(fresh_db: str, tmp_path: Path) -> None:
    rows = [
        (
            i,
            f"k{i % 7}",
            i * 3,
            f'row "{i}" \\ \t\n é' + ("\x01" if i % 50 == 0 else ""),
            dt.datetime(2024, 1, 2, 3, 4, 5, i, tzinfo=dt.UTC),
            dt.datetime(1999, 12, 31, 23, 59, 59),
            f"{i}.{i}",
            i % 2 == 0,
            bytes([i % 256, 0, 92]),
            None,
            dt.date(2024, 2, 29),
            "1 day",
            i % 100,
        )
        for i in range(1, 25_001)
    ]
    _load(fresh_db, "big", rows)
    _load(fresh_db, "small", rows[:3])
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # a table the columnar path declines
        conn.execute("CREATE TABLE jtab (id int PRIMARY KEY, j jsonb); INSERT INTO jtab VALUES (1, '{\"a\": 1}')")
    columnar = _snapshot_log(fresh_db, tmp_path / "a", "slot_a", columnar=True)
    rowwise = _snapshot_log(fresh_db, tmp_path / "b", "slot_b", columnar=False)
    assert len(columnar) == 25_000 + 3 + 1 + 3 * 3  # + a schema record per table and partition
    assert [r[:4] for r in columnar] == [r[:4] for r in rowwise]
    for a, b in itertools.zip_longest(columnar, rowwise):  # the two slots' consistent points differ
        assert a[:5] + (_LSN.sub(b'"lsn":0', a[5] or b""), a[6]) == b[:5] + (_LSN.sub(b'"lsn":0', b[5] or b""), b[6])
    lasts = [r for r in columnar if r[5] and b'"snapshot":"last"' in r[5]]
    assert len(lasts) == 1 and lasts[0][0] == "shop.public.small"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, min_size=0, max_size=60), chunk_bytes=st.sampled_from([1, 200, 700, 1 << 20]))
def test_text_chunks_typed_and_pure_are_equal(
    fresh_db: str, rows: list[tuple[object, ...]], chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`text_chunks` with the typed COPY loop (`take_copy`) and with its reference: the same
    chunks, each `-\\n` then whole COPY lines, closed at the first line that reaches
    `chunk_bytes`; together every line psycopg's own COPY reader gives, in order."""
    _load(fresh_db, "chunks", rows)
    with psycopg.connect(fresh_db, autocommit=True, **connect_options()) as conn:
        (table,) = list_tables(conn, lambda s, t: t == "chunks")
        with conn.cursor().copy("COPY (SELECT * FROM chunks) TO STDOUT") as copy:
            lines = [bytes(row) for row in copy]
    holder = psycopg.connect(fresh_db, **connect_options())
    try:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        snap = holder.execute("SELECT pg_export_snapshot()").fetchone()
        assert snap is not None
        assert compiled.take_copy is not None  # built by `pip install -e .`
        with SnapshotReader(fresh_db, snap[0], label="t") as reader:
            got = list(reader.text_chunks(table, chunk_bytes=chunk_bytes))
            with monkeypatch.context() as m:
                m.setattr(compiled, "take_copy", None)  # not built, or TRIBUTARY_IMPL=python
                want = list(reader.text_chunks(table, chunk_bytes=chunk_bytes))
            assert list(reader.text_chunks(table, chunk_bytes=chunk_bytes)) == got  # the next table's COPY too
    finally:
        holder.close()
    assert got == want
    assert all(type(c) is bytes and c.startswith(b"-\n") and len(c) > 2 for c in got)
    assert b"".join(c[2:] for c in got) == b"".join(lines)
    for chunk in got[:-1]:
        last = chunk[:-1].rfind(b"\n") + 1
        assert len(chunk) - 2 >= chunk_bytes > last - 2  # closed at the first line reaching it
