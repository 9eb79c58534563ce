"""The HTTP API as a user drives it: `tributary serve` on a real port, bank commands with httpx."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port, serving
from tests.waiting import run_process
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WRITE, READ, ADMIN = "k-write-123", "k-read-456", "k-admin-789"


@pytest.fixture
def api(fresh_db: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """The served API; `[api] http` is the test's indirect parameter when it has one (else the default)."""
    run_migrations(fresh_db)
    port = free_port()
    config = tmp_path / "t.toml"
    http = f'http = "{request.param}"\n' if hasattr(request, "param") else ""
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n'
        f"[api]\nport = {port}\nmax_body_bytes = 4096\n{http}"
        f'keys = [{{ key = "{WRITE}", scopes = ["write", "read"] }}, {{ key = "{READ}", scopes = ["read"] }},'
        f' {{ key = "{ADMIN}", scopes = ["admin"] }}]\n'
        '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n'
    )
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {WRITE}"}, timeout=10)
        try:
            yield client
        finally:
            client.close()
    assert "k-write-123" not in (tmp_path / "serve.err").read_text()  # keys never logged


def cmd(
    client: httpx.Client, stream: str, type_: str, data: dict[str, object] | None = None, **extra: object
) -> httpx.Response:
    return client.post(f"/commands/account/{stream}", json={"type": type_, "data": data or {}, **extra})


def test_a_bank_account_through_http(api: httpx.Client) -> None:
    opened = cmd(api, "acc-1", "open", {"owner": "ada", "overdraft_limit": "50"})
    assert opened.status_code == 200, opened.text
    assert opened.json()["version"] == 1 and opened.json()["events"][0]["type"] == "AccountOpened"
    assert cmd(api, "acc-1", "deposit", {"amount": "10.25"}).json()["version"] == 2
    withdrawn = cmd(api, "acc-1", "withdraw", {"amount": "20"})
    assert [e["type"] for e in withdrawn.json()["events"]] == ["MoneyWithdrawn", "OverdraftFeeCharged"]
    state = api.get("/streams/acc-1/state").json()
    assert state == {
        "stream_id": "acc-1",
        "stream_type": "account",
        "version": 4,
        "status": "open",
        "owner": "ada",
        "balance": "-14.75",
        "overdraft_limit": "50.00",
        "fees_charged": "5.00",
    }
    events = api.get("/streams/acc-1", params={"from_version": 2, "limit": 2}).json()["events"]
    assert [e["version"] for e in events] == [2, 3] and events[0]["data"] == {"amount": "10.25"}


def test_rules_conflicts_and_idempotency(api: httpx.Client) -> None:
    assert cmd(api, "acc-2", "deposit", {"amount": "1"}).json()["rule"] == "account_must_exist"
    cmd(api, "acc-2", "open", {"owner": "bob"})
    refused = cmd(api, "acc-2", "withdraw", {"amount": "0.01"})
    assert refused.status_code == 422 and refused.json()["rule"] == "overdraft_limit"
    conflict = cmd(api, "acc-2", "deposit", {"amount": "1"}, expected_version=0)
    assert conflict.status_code == 409 and conflict.json()["actual"] == 1
    first = cmd(api, "acc-2", "deposit", {"amount": "3"}, command_id="dep-1")
    again = cmd(api, "acc-2", "deposit", {"amount": "3"}, command_id="dep-1")
    assert again.status_code == 200 and again.json() == first.json()
    assert api.get("/streams/acc-2/state").json()["balance"] == "3.00"
    mismatch = cmd(api, "acc-2", "deposit", {"amount": "4"}, command_id="dep-1")
    assert mismatch.status_code == 422


def test_bad_inputs_never_500(api: httpx.Client) -> None:
    invalid = cmd(api, "acc-3", "open", {"owner": "x", "overdraft_limit": "-1"})
    assert invalid.status_code == 422 and "overdraft_limit" in invalid.text
    assert cmd(api, "acc-3", "transfer").status_code == 422
    assert api.post("/commands/nope/x", json={"type": "open"}).status_code == 404
    malformed = api.post("/commands/account/x", content=b"{not json", headers={"content-type": "application/json"})
    assert malformed.status_code in (400, 422)
    assert api.post("/commands/account/x", json={"data": {}}).status_code == 422  # no type
    big = api.post("/commands/account/x", json={"type": "open", "data": {"owner": "x" * 10_000}})
    assert big.status_code == 413
    assert api.get("/streams/nobody").status_code == 404


def test_api_keys_and_scopes(api: httpx.Client) -> None:
    base = str(api.base_url)
    with httpx.Client(base_url=base, timeout=10) as anonymous:
        assert anonymous.post("/commands/account/a", json={"type": "open", "data": {"owner": "x"}}).status_code == 401
        assert anonymous.get("/streams/a", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert anonymous.get("/healthz").status_code == 200
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {READ}"}, timeout=10) as reader:
        assert reader.post("/commands/account/a", json={"type": "open", "data": {"owner": "x"}}).status_code == 403
        assert reader.get("/topics").status_code == 403
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10) as admin:
        assert admin.get("/topics").status_code == 200
        assert admin.post("/commands/account/adm", json={"type": "open", "data": {"owner": "x"}}).status_code == 200


# A body over `max_body_bytes` is refused with 413 before it is validated, whatever else is wrong with it
# (or right: a join of a consumer group naming many long topic names is valid and can still be too large).
# A command that fits its schema may still be refused by the domain's rules (`decide`: 422 with the rule, e.g.
# deposit on an account never opened), which no JSON Schema can say; on the generic route, a stream type's
# command may be missing (422): so for commands only, 422 is an answer to schema-valid input too.
# (410: a stream a DELETE of the run deleted for good answers so, whatever the data. 422 on commands
# and stream metadata: data the schema allows but the store cannot hold, e.g. an integer beyond 64 bits.)
_CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "413", "429", "5xx"]

[[operations]]
include-path-regex = "^/commands/|/metadata$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "410", "422", "429"]
"""


PARSERS = pytest.mark.parametrize("api", ["h11", "httptools"], indirect=True)  # each parser fuzzed


def _schemathesis(api: httpx.Client, tmp_path: Path, *select: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "schemathesis.toml").write_text(_CONFIG)  # read from the working directory
    return run_process(
        [
            str(Path(sys.executable).parent / "schemathesis"),
            "run",
            f"{str(api.base_url).rstrip('/')}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            "15",
            "--seed",
            "1",
            "-H",
            f"Authorization: Bearer {ADMIN}",
            *select,
        ],
        what="schemathesis",
        cwd=tmp_path,
    )


@PARSERS
def test_schemathesis_every_check_passes(api: httpx.Client, tmp_path: Path) -> None:
    """Property-based fuzzing of every operation in /openapi.json with every schemathesis check: no 5xx,
    every status code, content type and body as declared, bad input refused, good input accepted."""
    # (A subscription is a response that never ends: its own tests drive it, tests/e2e/test_subscriptions.py.)
    run = _schemathesis(api, tmp_path, "--exclude-path-regex", "^/(views|all/subscribe)")
    assert run.returncode == 0, run.stdout[-6000:]
    assert "passed" in run.stdout


@PARSERS
def test_schemathesis_views_every_check_passes(api: httpx.Client, tmp_path: Path) -> None:
    """The same for /views and /views/{name} (a separate run: their routes are owned separately)."""
    run = _schemathesis(api, tmp_path, "--include-path-regex", "^/views")
    assert run.returncode == 0, run.stdout[-6000:]
    assert "passed" in run.stdout


def test_metrics_parse_and_count_commands(api: httpx.Client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    cmd(api, "m-1", "open", {"owner": "m"})
    cmd(api, "m-1", "withdraw", {"amount": "1"})  # rejected
    text = api.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"tributary_commands", "tributary_command_seconds"} <= set(families)
    outcomes = {
        s.labels["outcome"]: s.value for s in families["tributary_commands"].samples if s.name.endswith("_total")
    }
    assert outcomes.get("ok", 0) >= 1 and outcomes.get("CommandRejected", 0) >= 1
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["migrations"] == "ok"
