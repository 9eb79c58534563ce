"""Fuzz of a real `tributary serve` on a real Postgres: at least 3,000 generated `POST /commands`
requests and 3,000 generated view and stream reads, and not one answer of 500 or above.

Hypothesis generates the requests (derandomized: the same requests on every run, so CI is stable)
from what hostile clients send: lone UTF-16 surrogates (as JSON `\\ud83d` escapes and as invalid
UTF-8 in URLs), NUL, integers beyond 64 bits, NaN and Infinity, ids of thousands of characters,
deep nesting, unknown fields, operators and columns, forged cursors, and bytes that are no JSON.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from psycopg import sql

from tests.pg import PgServer, fresh_database
from tests.servers import free_port, serving
from tributary.eventstore.migrate import run_migrations
from tributary.projections.definition import Projection, Table
from tributary.projections.store import Store

pytestmark = pytest.mark.e2e

REQUESTS = 3000
COLUMNS = {"id": "bigint", "name": "text", "amount": "numeric(12,2)", "at": "timestamptz", "doc": "jsonb"}
MODULE = f"""
from tributary.projections.definition import Projection, Table

COLUMNS = {COLUMNS!r}
PROJECTIONS = [
    Projection(name="things", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=lambda df: df),
    Projection(name="unbuilt", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=lambda df: df),
]
"""
FUZZ = settings(
    max_examples=REQUESTS,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)


class Server:
    def __init__(self, client: httpx.Client, err: Path) -> None:
        self.client, self.err = client, err
        self.statuses: collections.Counter[int] = collections.Counter()

    def send(self, method: str, url: str, body: bytes | None = None) -> httpx.Response:
        headers = {"content-type": "application/json"} if body is not None else None
        got = self.client.request(method, url, content=body, headers=headers)
        self.statuses[got.status_code] += 1
        assert got.status_code < 500, f"{method} {url} {body!r} -> {got.status_code} {got.text}\n{self.log()}"
        return got

    def log(self) -> str:
        return self.err.read_text()[-4000:]


@pytest.fixture(scope="module", params=["h11", "httptools"])
def server(
    pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    """A served API on one database for the module, under each parser (`[api] http`) in turn."""
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "things.py").write_text(MODULE)
    with fresh_database(pg_server) as dsn:
        run_migrations(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            store = Store(conn)
            store.ensure()
            p = Projection(name="things", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=len)
            build = store.new_build(p)
            store.swap(build)
            base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
            conn.cursor().executemany(
                sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s)").format(sql.Identifier("views", build.table_name)),
                [
                    (i, f"n{i % 7}", Decimal(i) / 4, base + dt.timedelta(hours=i), json.dumps({"i": i, "t": [i % 3]}))
                    for i in range(1, 201)
                ],
            )
        port = free_port()
        config = tmp / "t.toml"
        config.write_text(
            f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp / "log"}"\n'
            f'[projections]\nmodules = ["{tmp / "things.py"}"]\n[api]\nport = {port}\nmax_body_bytes = 65536\n'
            f'http = "{request.param}"\n'
            '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n'
        )
        err = tmp / "serve.err"
        with serving(config, port, err_path=err) as url, httpx.Client(base_url=url, timeout=30) as client:
            yield Server(client, err)


# -- generated pieces --------------------------------------------------------------------------------
NASTY = ["\ud83d", "\udc00", "\x00", "\ufeff", "\u2028", "'", '"', "\\", "%", "/", "?", "#", "-", "😀", " ", "\n"]
CHAR = st.one_of(st.characters(), st.sampled_from(NASTY))
TEXT = st.one_of(
    st.text(CHAR, max_size=12),
    st.sampled_from(["", "0", "-1", "1.5", "1e400", "NaN", "null", "true", "2026-01-01T00:00:00Z", "abc"]),
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "\x00", "é", "\ud83d"]), st.integers(150, 1500)),
)
INT = st.one_of(st.integers(-10, 10), st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**40]))
NUMBER = st.one_of(INT, st.floats(allow_nan=True, allow_infinity=True))
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBER, TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
MONEY = st.one_of(
    st.sampled_from(["1", "0.01", "10.25", "-1", "0", "1.001", "99999999999999999999", "1e3", "NaN", "Infinity"]),
    NUMBER,
    TEXT,
)


def _url_part(text: str) -> str:
    """Percent-encoded UTF-8, an unpaired surrogate as the invalid bytes it would be (ED A0 BD)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


ACCOUNTS = st.sampled_from([f"acc-{i}" for i in range(1, 30)])
STREAM_ID = st.one_of(ACCOUNTS, ACCOUNTS, TEXT.filter(bool))
COMMAND_DATA = st.one_of(
    st.builds(
        lambda known, other: {**known, **other},
        st.fixed_dictionaries({}, optional={"owner": st.one_of(TEXT, JSON), "overdraft_limit": MONEY, "amount": MONEY}),
        st.dictionaries(TEXT, JSON, max_size=2) | st.just({}),
    ),
    JSON,
)
COMMAND = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["open", "deposit", "withdraw", "close"]), TEXT, JSON)},
    optional={
        "data": COMMAND_DATA,
        "expected_version": st.one_of(INT, JSON),
        "command_id": st.one_of(TEXT, JSON),
        "extra": JSON,
    },
)
_AMOUNT = {"amount": st.one_of(st.sampled_from(["1", "2.50", "100", "0.01"]), MONEY)}
PLAUSIBLE = st.builds(  # the right fields for the command type, mostly good values: 200, 409 and rule refusals
    lambda command, extra: json.dumps({**command, **extra}).encode(),
    st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("open"), "data": st.fixed_dictionaries({"owner": st.sampled_from(["ada", "bob"]) | TEXT})}
        ),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["deposit", "withdraw"]), "data": st.fixed_dictionaries(_AMOUNT)}
        ),
        st.just({"type": "close", "data": {}}),
    ),
    st.fixed_dictionaries(
        {}, optional={"expected_version": st.integers(0, 6), "command_id": st.sampled_from(["c1", "c2", "c3"])}
    ),
)
BODY = st.one_of(
    PLAUSIBLE,
    PLAUSIBLE,
    PLAUSIBLE,
    COMMAND.map(lambda c: json.dumps(c).encode()),  # ensure_ascii: surrogates and NUL as \u escapes
    COMMAND.map(lambda c: json.dumps(c, ensure_ascii=False).encode("utf-8", "surrogatepass")),  # invalid UTF-8
    JSON.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.integers(1, 2000).map(lambda n: b'{"type": "open", "data": ' + b"[" * n + b"]" * n + b"}"),
)


@given(
    stream_type=st.one_of(st.just("account"), st.just("account"), TEXT.filter(bool)),
    stream=STREAM_ID,
    body=BODY,
)
@FUZZ
def _command(server: Server, stream_type: str, stream: str, body: bytes) -> None:
    server.send("POST", f"/commands/{_url_part(stream_type)}/{_url_part(stream)}", body)


def test_fuzzed_commands_never_get_a_5xx(server: Server) -> None:
    _command(server)
    assert sum(server.statuses.values()) >= REQUESTS, server.statuses
    assert all(server.statuses[s] for s in (200, 404, 409, 422)), server.statuses  # every outcome was reached


FILTER_KEY = st.one_of(
    st.builds(
        lambda c, op: f"{c}__{op}" if op else c,
        st.sampled_from(list(COLUMNS)),
        st.sampled_from(["", "eq", "ne", "gt", "gte", "lt", "lte", "like", ""]),
    ),
    st.sampled_from(["limit", "cursor", "order_by"]),
    TEXT,
)
CURSOR = st.one_of(
    TEXT,
    st.lists(st.one_of(st.none(), INT, st.floats(), TEXT, JSON), max_size=3).map(
        lambda v: base64.urlsafe_b64encode(json.dumps(v).encode()).decode().rstrip("=")
    ),
)
ORDER = st.one_of(
    st.builds(lambda sign, c: sign + c, st.sampled_from(["", "-", "--", "+"]), st.sampled_from(list(COLUMNS))), TEXT
)
PARAM = st.one_of(
    st.tuples(FILTER_KEY, st.one_of(TEXT, INT.map(str), st.floats().map(str))),
    st.tuples(st.just("limit"), st.one_of(INT.map(str), TEXT)),
    st.tuples(st.just("cursor"), CURSOR),
    st.tuples(st.just("order_by"), ORDER),
)


def _query(params: list[tuple[str, str]]) -> str:
    return "&".join(f"{_url_part(k)}={_url_part(v)}" for k, v in params)


READ = st.one_of(
    st.builds(
        lambda name, params: f"/views/{_url_part(name)}?{_query(params)}",
        st.one_of(st.sampled_from(["things", "things", "things", "unbuilt"]), TEXT.filter(bool)),
        st.lists(PARAM, max_size=4),
    ),
    st.builds(
        lambda stream, tail, params: f"/streams/{_url_part(stream)}{tail}?{_query(params)}",
        STREAM_ID,
        st.sampled_from(["", "/state"]),
        st.lists(st.tuples(st.sampled_from(["from_version", "limit", "x"]), st.one_of(INT.map(str), TEXT)), max_size=2),
    ),
)


@given(url=READ, method=st.sampled_from(["GET", "GET", "GET", "HEAD"]))
@FUZZ
def _read(server: Server, url: str, method: str) -> None:
    server.send(method, url)


def test_fuzzed_view_and_stream_reads_never_get_a_5xx(server: Server) -> None:
    for stream in ("acc-1", "acc-2"):  # streams to read (the command fuzz may not have opened them)
        server.send("POST", f"/commands/account/{stream}", b'{"type": "open", "data": {"owner": "f"}}')
    server.statuses.clear()
    _read(server)
    assert sum(server.statuses.values()) >= REQUESTS, server.statuses
    assert all(server.statuses[s] for s in (200, 404, 422)), server.statuses
