"""Bad input through a real `tributary serve` on a real Postgres gets a 4xx with one line, never a 500;
a service database that does not answer gets a 503 with one line."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
from psycopg import sql

from tests.pg import REPO_ROOT, PgServer, fresh_database
from tests.servers import free_port, serving
from tests.waiting import wait_progress
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.values import MAX_ID_LENGTH

pytestmark = pytest.mark.e2e

MODULE = """
from tributary.projections.definition import Projection, Table

PROJECTIONS = [
    Projection(name="balances", version=1, topics=("none",),
               table=Table.of({"id": "text", "balance": "numeric"}, ["id"]), build=lambda df: df),
]
"""


class Api:
    def __init__(self, client: httpx.Client, server: PgServer, dbname: str) -> None:
        self.client, self.server, self.dbname = client, server, dbname

    def raw(self, stream: str, body: bytes) -> httpx.Response:
        return self.client.post(
            f"/commands/account/{stream}", content=body, headers={"content-type": "application/json"}
        )


@pytest.fixture(scope="module")
def api(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("bad_input")
    (tmp / "balances.py").write_text(MODULE)
    with fresh_database(pg_server) as dsn:
        run_migrations(dsn)
        port = free_port()
        config = tmp / "t.toml"
        config.write_text(
            f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp / "log"}"\n'
            f'[projections]\nmodules = ["{tmp / "balances.py"}"]\n[api]\nport = {port}\n'
            '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n'
        )
        with serving(config, port, err_path=tmp / "serve.err") as base, httpx.Client(base_url=base, timeout=30) as c:
            yield Api(c, pg_server, urlsplit(dsn).path.lstrip("/"))


def _one_line(got: httpx.Response, status: int, *words: str) -> None:
    """`status`, a UTF-8 problem body whose `detail` is one line and says `words`."""
    assert got.status_code == status, got.text
    assert got.headers["content-type"] == "application/problem+json" and got.json()["status"] == status
    message = got.json()["detail"]
    assert "\n" not in message and all(w in message for w in words), message


@pytest.mark.parametrize(
    "body",
    [
        b'{"type": "open", "data": {"owner": "ada\\ud83d"}}',
        b'{"type": "open", "data": {"owner": "ada", "\\ud83d": 1}}',
        b'{"type": "open", "data": {"owner": "ada"}, "command_id": "c-\\udc00"}',
        b'{"type": "\\ud83d", "data": {}}',
        b'{"type": "open", "data": {"owner": "ada"}, "\\ud83d": 1}',
    ],
)
def test_a_lone_surrogate_anywhere_in_the_body_is_a_422(api: Api, body: bytes) -> None:
    got = api.raw("sur-1", body)
    assert got.status_code == 422, got.text
    got.content.decode()  # valid UTF-8
    assert api.client.get("/streams/sur-1").status_code == 404  # nothing stored


def test_a_surrogate_pair_is_a_character_and_is_stored(api: Api) -> None:
    got = api.raw("pair-1", b'{"type": "open", "data": {"owner": "ada \\ud83d\\ude00"}}')
    assert got.status_code == 200, got.text
    assert api.client.get("/streams/pair-1/state").json()["owner"] == "ada 😀"


def test_nul_in_a_field_value_is_a_422_naming_the_field(api: Api) -> None:
    got = api.raw("nul-1", b'{"type": "open", "data": {"owner": "a\\u0000b"}}')
    _one_line(got, 422, "data.owner", "NUL")


def test_nul_in_a_stream_id_is_a_422_for_commands_and_reads(api: Api) -> None:
    _one_line(api.raw("%00abc", b'{"type": "open", "data": {"owner": "a"}}'), 422, "stream id", "NUL")
    _one_line(api.client.get("/streams/%00abc"), 422, "stream id", "NUL")
    _one_line(api.client.get("/streams/a%00/state"), 422, "stream id", "NUL")


def test_stream_ids_longer_than_the_maximum_are_a_422(api: Api) -> None:
    longest = "s" * MAX_ID_LENGTH
    assert api.raw(longest, b'{"type": "open", "data": {"owner": "a"}}').status_code == 200
    assert api.client.get(f"/streams/{longest}").status_code == 200
    for length in (MAX_ID_LENGTH + 1, 5000, 30_000):
        too_long = "s" * length
        _one_line(
            api.raw(too_long, b'{"type": "open", "data": {"owner": "a"}}'),
            422,
            f"{length} characters long; the maximum is {MAX_ID_LENGTH}",
        )
        _one_line(api.client.get(f"/streams/{too_long}"), 422, "the maximum is")


@pytest.mark.parametrize("version", [2**63, 2**64, 10**40])
def test_expected_version_beyond_bigint_is_a_422(api: Api, version: int) -> None:
    got = api.raw("ev-1", b'{"type": "open", "data": {"owner": "a"}, "expected_version": %d}' % version)
    assert got.status_code == 422, got.text
    assert api.client.get("/streams/ev-1", params={"from_version": 2**64}).status_code == 422


def test_a_conflict_says_which_stream_expected_and_actual_and_to_retry(api: Api) -> None:
    assert api.raw("c-1", b'{"type": "open", "data": {"owner": "a"}}').status_code == 200
    got = api.raw("c-1", b'{"type": "deposit", "data": {"amount": "1"}, "expected_version": 0}')
    _one_line(got, 409, "'c-1'", "version 1", "expected 0", "retry")
    problem = got.json()
    assert problem["code"] == "conflict"
    assert problem["stream"] == "c-1" and problem["expected"] == 0 and problem["actual"] == 1


def test_the_conflict_example_of_docs_eventstore_md_is_what_the_api_answers(api: Api) -> None:
    """docs/eventstore.md shows a 409 body for a stream at version 3 and a command expecting 0."""
    text = (REPO_ROOT / "docs" / "eventstore.md").read_text()
    example = text[text.index("The 409 body says what happened") :]
    example = example[example.index("```json") + len("```json") : example.index("```", example.index("```json") + 7)]
    documented = orjson.loads(example)
    stream = documented["stream"]
    assert api.raw(stream, b'{"type": "open", "data": {"owner": "a"}}').status_code == 200
    for _ in range(documented["actual"] - 1):
        assert api.raw(stream, b'{"type": "deposit", "data": {"amount": "1"}}').status_code == 200
    got = api.raw(stream, b'{"type": "deposit", "data": {"amount": "1"}, "expected_version": 0}')
    assert got.status_code == 409 and got.headers["content-type"].startswith("application/problem+json")
    assert got.json() == documented


def test_order_by_takes_one_minus_only(api: Api) -> None:
    got = api.client.get("/views/balances", params={"order_by": "--balance"})
    _one_line(got, 422, "'-balance'")
    # one `-` is a descending order: the request gets past its parameters (to "not built yet")
    assert api.client.get("/views/balances", params={"order_by": "-balance"}).status_code == 404


def test_head_is_answered_like_get(api: Api) -> None:
    for path in ("/healthz", "/readyz", "/streams/c-1", "/views", "/metrics"):
        get, head = api.client.get(path), api.client.head(path)
        assert head.status_code == get.status_code == 200, (path, head.status_code)
        assert head.content == b""


def test_a_trailing_slash_does_not_redirect_to_the_host_header(api: Api) -> None:
    got = api.client.get("/views/", headers={"Host": "evil.example"})
    assert got.status_code == 404 and "evil.example" not in got.headers.get("location", "")


def test_commands_while_the_database_refuses_connections_get_a_503_then_recover(api: Api) -> None:
    """Every connection of the service database closed and new ones refused (a restart, a failover):
    commands and stream reads answer a one-line 503, never a 500; once the database takes connections
    again, commands succeed."""
    assert api.raw("down-1", b'{"type": "open", "data": {"owner": "a"}}').status_code == 200
    name = sql.Identifier(api.dbname)
    with api.server.admin() as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (api.dbname,),
            )
            for _ in range(3):
                _one_line(api.raw("down-1", b'{"type": "deposit", "data": {"amount": "1"}}'), 503, "retry")
            _one_line(api.client.get("/streams/down-1"), 503, "retry")
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name))
    answers: list[httpx.Response] = []

    def taken() -> bool:  # 503 (retry) until the server has its connections back
        answers.append(api.raw("down-1", b'{"type": "deposit", "data": {"amount": "1"}, "command_id": "down-dep"}'))
        assert answers[-1].status_code in (200, 503), answers[-1].text
        return answers[-1].status_code == 200

    wait_progress(taken, lambda: None, what="the deposit to be taken once the database is back", poll=0.5)
