"""GET /views and GET /views/{name} through a real `tributary serve` on a real Postgres.

The views are registered the way the projection runner leaves them (a build in
tributary_projections.builds, the view `views.<name>` over the build's table) and filled with
plain INSERTs, so no Spark is needed.

Pagination guarantee (keyset over (order column, primary key), no snapshot held between pages),
checked by `test_pages_while_a_writer_inserts`: following `next_cursor` from the first page, every
row that existed before the first page was requested, and was neither updated nor deleted during
the scan, appears exactly once; no row appears twice; a row inserted during the scan appears at most
once, and only if its (order value, key) sorts after the cursor of the page that was read when it
committed. Rows whose order column is updated during a scan may be missed or repeated.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from psycopg import sql

from tests.pg import PgServer, fresh_database
from tests.servers import free_port, serving
from tests.waiting import wait_progress, wait_threads
from tributary.projections.definition import Projection, Table
from tributary.projections.store import Store

pytestmark = pytest.mark.e2e

MODULE = """
from tributary.projections.definition import Projection, Table

COLUMNS = {"id": "bigint", "name": "text", "amount": "numeric(12,2)", "at": "timestamptz", "note": "text"}
PROJECTIONS = [
    Projection(name="things", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=lambda df: df),
    Projection(name="feed", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=lambda df: df),
    Projection(name="unbuilt", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=lambda df: df),
]
"""
COLUMNS = {"id": "bigint", "name": "text", "amount": "numeric(12,2)", "at": "timestamptz", "note": "text"}
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
THINGS = 240
FEED = 3000  # even ids 2..2*FEED; the concurrent writer inserts odd ids


def _row(i: int) -> dict[str, Any]:
    """Non-unique name/amount/at (ties broken by the key) and a nullable note; ASCII names sort alike in any collation."""
    return {
        "id": i,
        "name": f"n{i % 13:02d}",
        "amount": Decimal(i % 50) * Decimal("1.25"),
        "at": BASE + dt.timedelta(minutes=i // 3),
        "note": None if i % 5 == 0 else f"x{i % 11:02d}",
    }


def _insert(conn: psycopg.Connection[Any], table: str, rows: list[dict[str, Any]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {} (id, name, amount, at, note) VALUES (%s, %s, %s, %s, %s)").format(
                sql.Identifier("views", table)
            ),
            [tuple(r.values()) for r in rows],
        )


class Views:
    """The running server plus what the test needs to check the database behind it."""

    def __init__(self, client: httpx.Client, dsn: str, tables: dict[str, str]) -> None:
        self.client = client
        self.dsn = dsn
        self.tables = tables  # view name -> build table

    def count(self, view: str) -> int:
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("views", view))).fetchone()
        return int(row[0]) if row else -1


@pytest.fixture(scope="module")
def views(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Views]:
    tmp = tmp_path_factory.mktemp("views")
    (tmp / "things.py").write_text(MODULE)
    with fresh_database(pg_server) as dsn:
        tables = {}
        with psycopg.connect(dsn, autocommit=True) as conn:
            store = Store(conn)
            store.ensure()
            for name in ("things", "feed"):
                p = Projection(name=name, version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=len)
                build = store.new_build(p)
                store.swap(build)  # what the runner does after a build: views.<name> -> this build's table
                tables[name] = build.table_name
            _insert(conn, tables["things"], [_row(i) for i in range(1, THINGS + 1)])
            _insert(conn, tables["feed"], [_row(2 * i) for i in range(1, FEED + 1)])
            conn.execute("CREATE TABLE public.x (v int)")  # the target of the injection attempts below
        port = free_port()
        config = tmp / "t.toml"
        config.write_text(
            f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp / "log"}"\n'
            f'[projections]\nmodules = ["{tmp / "things.py"}"]\n[api]\nport = {port}\n'
        )
        with serving(config, port, err_path=tmp / "serve.err") as base, httpx.Client(base_url=base, timeout=30) as c:
            yield Views(c, dsn, tables)


def _expected(**where: Any) -> list[dict[str, Any]]:
    return [
        r for r in map(_row, range(1, THINGS + 1)) if all(r[k] is not None and test(r[k]) for k, test in where.items())
    ]


def _json_row(r: dict[str, Any]) -> dict[str, Any]:
    """A row as the API renders it: numerics as exact strings, timestamps in ISO 8601."""
    return {
        **r,
        "amount": str(r["amount"]) if r["amount"] is not None else None,
        "at": r["at"].isoformat(),
    }


def _get(views: Views, view: str, /, **params: Any) -> httpx.Response:
    return views.client.get(f"/views/{view}", params=params)


def _scan(
    views: Views, view: str, limit: int, /, between: Callable[[], None] = lambda: None, **params: Any
) -> tuple[list[dict[str, Any]], int]:
    """Every page from the first, following next_cursor, calling `between` before each next page;
    (rows in page order, pages)."""
    rows: list[dict[str, Any]] = []
    cursor, pages = None, 0
    while True:
        if pages:
            between()
        got = _get(views, view, limit=limit, **params, **({"cursor": cursor} if cursor else {}))
        assert got.status_code == 200, got.text
        body = got.json()
        pages += 1
        assert len(body["rows"]) <= limit
        rows.extend(body["rows"])
        cursor = body["next_cursor"]
        if cursor is None:
            return rows, pages


def test_lists_views_with_columns_key_and_build(views: Views) -> None:
    listed = {v["name"]: v for v in views.client.get("/views").json()}
    assert set(listed) == {"things", "feed", "unbuilt"}
    assert listed["unbuilt"]["build"] is None and listed["unbuilt"]["table"] is None
    things = listed["things"]
    assert things["columns"] == [{"name": k, "type": t} for k, t in COLUMNS.items()]
    assert things["primary_key"] == ["id"] and things["projection_version"] == 1
    assert things["table"] == views.tables["things"] and things["build"] == 1 and things["updated_at"]


OPS = {
    "": lambda a, b: a == b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "gt": lambda a, b: a > b,
    "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "lte": lambda a, b: a <= b,
}
# (column, the value as sent in the URL, the same value in Python)
VALUES = [
    ("id", "120", 120),
    ("amount", "31.25", Decimal("31.25")),
    ("amount", "31.250", Decimal("31.25")),  # cast to numeric, not compared as text
    ("name", "n07", "n07"),
    ("at", "2026-01-01T00:40:00Z", BASE + dt.timedelta(minutes=40)),
    ("at", "2026-01-01T01:40:00+01:00", BASE + dt.timedelta(minutes=40)),  # an offset is honoured
]


@pytest.mark.parametrize(("column", "sent", "value"), VALUES)
@pytest.mark.parametrize("op", list(OPS))
def test_filter_every_operator_and_type(views: Views, column: str, sent: str, value: Any, op: str) -> None:
    key = f"{column}__{op}" if op else column
    got = _get(views, "things", **{key: sent}, limit=1000)
    assert got.status_code == 200, got.text
    want = _expected(**{column: lambda v, op=op: OPS[op](v, value)})
    assert want, "a filter that matches nothing proves little"
    assert got.json()["rows"] == [_json_row(r) for r in want]  # default order: the primary key
    assert got.json()["next_cursor"] is None


def test_filters_combine_with_and(views: Views) -> None:
    got = _get(views, "things", name="n03", amount__gte="20", at__lt="2026-01-01T01:00:00Z", limit=1000)
    want = _expected(
        name=lambda v: v == "n03",
        amount=lambda v: v >= 20,
        at=lambda v: v < BASE + dt.timedelta(hours=1),
    )
    assert want and got.json()["rows"] == [_json_row(r) for r in want]


@pytest.mark.parametrize("order_by", ["id", "-id", "amount", "-amount", "name", "-name", "at", "-at"])
def test_order_by_and_every_page(views: Views, order_by: str) -> None:
    """Ascending or descending on any declared column, ties broken by the key; pages of 7 concatenate to the
    same order, each row once."""
    column, descending = order_by.lstrip("-"), order_by.startswith("-")
    want = sorted(map(_row, range(1, THINGS + 1)), key=lambda r: (r[column], r["id"]), reverse=descending)
    one = _get(views, "things", order_by=order_by, limit=1000).json()
    assert one["rows"] == [_json_row(r) for r in want]
    rows, pages = _scan(views, "things", 7, order_by=order_by)
    assert rows == one["rows"] and pages == -(-THINGS // 7)


def test_order_by_a_column_with_nulls_pages_every_row(views: Views) -> None:
    """`note` is NULL in every fifth row: NULLs sort last (asc) / first (desc) and must not end the scan."""
    for order_by in ("note", "-note"):
        rows, _ = _scan(views, "things", 10, order_by=order_by)
        assert sorted(r["id"] for r in rows) == list(range(1, THINGS + 1)), order_by


def test_limit_cap(views: Views) -> None:
    assert len(_get(views, "things", limit=1000).json()["rows"]) == THINGS
    assert len(_get(views, "feed", limit=1000).json()["rows"]) == 1000
    for bad in ("1001", "0", "-1", "ten"):
        got = _get(views, "things", limit=bad)
        assert got.status_code == 422 and "limit" in got.text, (bad, got.text)
    assert _get(views, "things").json()["next_cursor"] is not None  # default page: 100 of 240


def test_unknown_column_operator_or_view(views: Views) -> None:
    for key in ("nope", "id__like", "amount__between", "id__ilike", "id__", "note__", "id__eq__"):
        got = _get(views, "things", **{key: "1"})
        assert got.status_code == 422 and key in got.json()["detail"], got.text
    got = _get(views, "things", order_by="-nope")
    assert got.status_code == 422 and "nope" in got.json()["detail"]
    got = _get(views, "nothing")
    assert got.status_code == 404 and "nothing" in got.json()["detail"]
    got = _get(views, "unbuilt")
    assert got.status_code == 404 and "tributary project run unbuilt" in got.json()["detail"]
    got = _get(views, "things", id="abc")
    assert got.status_code == 422 and "type" in got.json()["detail"]


def _cursor(values: Any) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(values)).decode().rstrip("=")


# Column names, operators, order_by and view names are never composed into SQL unless declared.
NAME_ATTEMPTS: list[dict[str, str]] = [
    {"id;DROP TABLE x": "1"},
    {'"id"': "1"},
    {"id = 1 OR 1=1 --": "1"},
    {"id__gte;DROP TABLE x": "1"},
    {"order_by": "id desc; --"},
    {"order_by": "-id;DROP TABLE x"},
    {"order_by": '"id"'},
]
CURSOR_ATTEMPTS = [
    "!!!not base64!!!",
    "AAAA",
    _cursor({"id": 1}),
    _cursor([1, 2]),
    _cursor(["1; DROP TABLE x"]),
    _cursor(["abc"]),
    _cursor([[1]]),
    _cursor([{"a": 1}]),
    _cursor([True]),
]


def test_injection_in_names_is_refused(views: Views) -> None:
    before = views.count("things")
    for params in NAME_ATTEMPTS:
        got = _get(views, "things", **params)
        assert got.status_code == 422, (params, got.status_code, got.text)
    for name in ("things;DROP TABLE x", 'things"', "things UNION SELECT 1"):
        assert views.client.get(f"/views/{name}").status_code == 404, name
    assert views.count("things") == before
    assert views.count("things") == THINGS and _table_exists(views, "public.x")


def test_injection_in_values_is_bound(views: Views) -> None:
    for value in ("1' OR '1'='1", "n01' OR '1'='1", "n01'; DROP TABLE x; --"):
        got = _get(views, "things", name=value)
        assert got.status_code == 200 and got.json()["rows"] == [], (value, got.text)  # compared as one string
    for params in ({"id": "1 OR 1=1"}, {"id__gt": "0; DROP TABLE x"}, {"at": "now(); DROP TABLE x"}):
        got = _get(views, "things", **params)
        assert got.status_code == 422, (params, got.status_code, got.text)  # cast to the column type: refused
    got = _get(views, "things", name="n\x00")
    assert got.status_code in (400, 422) and "NUL" in got.text, got.text  # why, not "None"
    assert views.count("things") == THINGS and _table_exists(views, "public.x")


@pytest.mark.parametrize("cursor", CURSOR_ATTEMPTS)
def test_tampered_cursor_is_refused(views: Views, cursor: str) -> None:
    got = _get(views, "things", cursor=cursor)
    assert got.status_code in (400, 422), got.text
    assert views.count("things") == THINGS and _table_exists(views, "public.x")


def test_forged_but_well_typed_cursor_is_bound(views: Views) -> None:
    """The cursor is not signed: a forged one of the right shape is just a start position, bound as a value."""
    got = _get(views, "things", cursor=_cursor([2]), limit=3)
    assert got.status_code == 200 and [r["id"] for r in got.json()["rows"]] == [3, 4, 5]
    assert views.count("things") == THINGS


def _table_exists(views: Views, name: str) -> bool:
    with psycopg.connect(views.dsn) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("order_by", ["id", "-id", "amount", "-at", "note"])
def test_pages_while_a_writer_inserts(views: Views, order_by: str) -> None:
    """The guarantee in the module docstring: a writer commits rows (odd ids, spread over the whole key
    and value range) between and during page reads."""
    before = {r["id"] for r in _scan(views, "feed", 1000)[0]}
    assert len(before) >= FEED
    stop = threading.Event()
    inserted: list[int] = []
    rng = random.Random(order_by)

    def write() -> None:
        insert = sql.SQL(
            "INSERT INTO {} (id, name, amount, at, note) SELECT * FROM unnest(%s::bigint[], %s::text[], "
            "%s::numeric[], %s::timestamptz[], %s::text[]) ON CONFLICT DO NOTHING"
        ).format(sql.Identifier("views", views.tables["feed"]))
        with psycopg.connect(views.dsn, autocommit=True) as conn:
            while not stop.is_set():
                ids = [2 * rng.randrange(4 * FEED) + 1 for _ in range(5)]  # odd: new, spread over twice the range
                rows = [_row(i) for i in ids]
                conn.execute(insert, [[r[c] for r in rows] for c in COLUMNS])
                inserted.extend(ids)  # after the commit

    writer = threading.Thread(target=write, name="views-writer")
    writer.start()
    try:
        # the writer is committing before the first page
        wait_progress(lambda: len(inserted) >= 20, lambda: len(inserted), what="the writer's first commits", poll=0.01)
        at_start = len(inserted)

        def a_batch_commits() -> None:  # the writer runs freely; this only makes sure it commits between pages
            target = len(inserted) + 1
            wait_progress(lambda: len(inserted) >= target, lambda: len(inserted), what="a commit", poll=0.001)

        seen, pages = _scan(views, "feed", 50, between=a_batch_commits, order_by=order_by)
        during = len(inserted) - at_start
    finally:
        stop.set()
        wait_threads([writer], what="the writer to stop", progress=lambda: len(inserted))
    ids = [r["id"] for r in seen]
    assert len(ids) == len(set(ids)), "a row was returned twice"
    existing = before | set(inserted[:at_start])  # committed before the first page was asked for
    assert existing <= set(ids), f"{len(existing - set(ids))} rows that existed before the scan were missed"
    assert set(ids) - existing <= set(inserted)
    assert during >= 5 * (pages - 1), (pages, during)  # the writer really committed between every two pages
    assert set(ids) - existing, "no row inserted during the scan was seen: the scan did not overlap the writer"


def test_lost_database_connections_give_503_then_recover(views: Views) -> None:
    """Every connection of the service database killed (a restart, a failover, an admin's
    pg_terminate_backend): a view request answers 200 or a one-line 503, never a 500, and the
    connections are replaced by the next requests."""
    assert _get(views, "things", id=1).status_code == 200
    with psycopg.connect(views.dsn, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchone()
    assert killed is not None and killed[0] >= 1
    statuses = []
    for _ in range(3):
        got = _get(views, "things", id=1)
        statuses.append(got.status_code)
        if got.status_code == 503:
            assert "service database did not answer" in got.json()["detail"]
        else:
            assert got.status_code == 200, got.text
            assert got.json()["rows"] == [_json_row(_row(1))]
    assert statuses[-1] == 200 and statuses.count(503) <= 1, statuses


def test_readers_during_swaps_get_one_build_per_page_and_no_error(views: Views) -> None:
    """The runner's swap (the view dropped and created over another build, in one transaction)
    while the API answers from prepared statements on pipelined connections: every request is a
    200 whose page comes from one build, old or new, never a mix."""
    p = Projection(name="feed", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=len)
    with psycopg.connect(views.dsn, autocommit=True) as conn:
        store = Store(conn)
        original = store.current("feed")
        assert original is not None
        builds = []
        for k in range(3):
            b = store.new_build(p)
            _insert(conn, b.table_name, [{**_row(2 * i), "note": f"b{k}"} for i in range(1, 301)])
            builds.append(b)
    stop = threading.Event()
    swaps = []

    def swapper() -> None:
        with psycopg.connect(views.dsn, autocommit=True) as conn:
            store = Store(conn)
            for b in itertools.cycle([*builds, original]):
                if stop.is_set():
                    break
                store.swap(b)
                swaps.append(b.build)
                time.sleep(0.005)
            store.swap(original)

    thread = threading.Thread(target=swapper)
    thread.start()
    seen: set[str] = set()
    try:
        for i in range(400):
            got = _get(views, "feed", limit=20) if i % 2 else _get(views, "feed", id=2 * (1 + i % 300))
            assert got.status_code == 200, got.text
            notes = {r["note"] for r in got.json()["rows"]}
            new = {n for n in notes if n and n.startswith("b")}
            assert len(new) <= 1 and (not new or notes == new), notes  # one build per page
            seen |= new or {"original"}
    finally:
        stop.set()
        thread.join()
        with psycopg.connect(views.dsn, autocommit=True) as conn:
            store = Store(conn)
            for b in builds:
                store.drop_build("feed", b.table_name)
    assert len(swaps) > 20 and len(seen) >= 2, (len(swaps), seen)
    assert _get(views, "feed", id=2).json()["rows"][0]["note"] == _row(2)["note"]
