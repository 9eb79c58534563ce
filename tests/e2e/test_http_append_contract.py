"""The append contract and the reads over HTTP, with a domain written here (a task list, not the
bank): every expected-version form, metadata from the request to the store and into the log's
headers (through capture), `$all` paged across streams in commit order, the streams of a type and
a stream read backwards. `tributary serve` runs on a loopback port and loads the domain from a file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.capture.helpers import cli, records
from tests.servers import free_port, serving
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

# The domain, a task list, as a user writes it: a file listed in `[eventstore] modules`.
TASKLIST = """
from pydantic import BaseModel, ConfigDict

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import CommandRejected


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AddTask(_Model):
    title: str


class CompleteTask(_Model):
    title: str


class TaskAdded(_Model):
    title: str


class TaskCompleted(_Model):
    title: str


class Tasks(_Model):
    open: tuple[str, ...] = ()
    done: tuple[str, ...] = ()


def decide(state: Tasks, command: AddTask | CompleteTask) -> list[BaseModel]:
    if isinstance(command, AddTask):
        if command.title in state.open or command.title in state.done:
            raise CommandRejected("unique_title", f"there is a task {command.title!r} already")
        return [TaskAdded(title=command.title)]
    if command.title not in state.open:
        raise CommandRejected("open_task", f"no open task {command.title!r}")
    return [TaskCompleted(title=command.title)]


def evolve(state: Tasks, event: TaskAdded | TaskCompleted) -> Tasks:
    if isinstance(event, TaskAdded):
        return Tasks(open=(*state.open, event.title), done=state.done)
    return Tasks(open=tuple(t for t in state.open if t != event.title), done=(*state.done, event.title))


AGGREGATE = Aggregate(
    stream_type="tasklist",
    state_type=Tasks,
    commands={"add": AddTask, "complete": CompleteTask},
    events=[TaskAdded, TaskCompleted],
    decide=decide,
    evolve=evolve,
)
"""


@pytest.fixture
def config(fresh_db: str, tmp_path: Path) -> Path:
    run_migrations(fresh_db)
    (tmp_path / "tasklist.py").write_text(TASKLIST)
    path = tmp_path / "t.toml"
    path.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\nlinger_ms = 2\n'
        f'[eventstore]\nmodules = ["{tmp_path / "tasklist.py"}"]\n[api]\nport = {free_port()}\n'
    )
    return path


@pytest.fixture
def api(config: Path, tmp_path: Path) -> Iterator[httpx.Client]:
    port = int(config.read_text().rsplit("port = ", 1)[1].split()[0])
    with (
        serving(config, port, err_path=tmp_path / "serve.err") as base,
        httpx.Client(base_url=base, timeout=10) as client,
    ):
        yield client


def send(api: httpx.Client, stream: str, type_: str, title: str, **extra: object) -> httpx.Response:
    return api.post(f"/commands/tasklist/{stream}", json={"type": type_, "data": {"title": title}, **extra})


def test_every_expected_version_form(api: httpx.Client) -> None:
    def status(stream: str, title: str, expected: object) -> tuple[int, Any]:
        r = send(api, stream, "add", title, expected_version=expected)
        return r.status_code, r.json()["version"] if r.status_code == 200 else r.json()

    refused = send(api, "l1", "add", "a", expected_version="stream_exists")
    assert refused.status_code == 409
    assert refused.json() | {"detail": ""} == {
        "type": "urn:tributary:problem:conflict",
        "title": "Version conflict",
        "status": 409,
        "code": "conflict",
        "detail": "",
        "stream": "l1",
        "expected": "stream_exists",
        "actual": 0,
        "attempts": 1,
    }
    assert status("l1", "a", "no_stream") == (200, 1)
    code, detail = status("l1", "b", "no_stream")
    assert (code, detail["expected"], detail["actual"]) == (409, "no_stream", 1)
    assert status("l1", "b", "stream_exists") == (200, 2)
    assert status("l1", "c", "any") == (200, 3)
    assert status("l1", "d", None) == (200, 4)
    assert status("l1", "e", 4) == (200, 5)
    code, detail = status("l1", "f", 3)
    assert (code, detail["expected"], detail["actual"]) == (409, 3, 5)
    code, detail = status("l2", "a", 2)  # a version the stream has not reached
    assert (code, detail["actual"]) == (409, 0)
    assert status("l2", "a", 0) == (200, 1)  # 0: no stream yet, as no_stream
    for bad in ("some", -1, 2**53, 1.5, [1], "3", False, True):
        assert send(api, "l1", "add", "z", expected_version=bad).status_code == 422, bad
    assert [e["data"]["title"] for e in api.get("/streams/l1").json()["events"]] == ["a", "b", "c", "d", "e"]
    schema = api.get("/openapi.json").json()["components"]["schemas"]["CommandRequest"]["properties"]
    assert {"any", "no_stream", "stream_exists"} <= {
        v for alt in schema["expected_version"]["anyOf"] for v in alt.get("enum", [])
    }


def test_metadata_from_the_request_to_the_log_headers(api: httpx.Client, config: Path, tmp_path: Path) -> None:
    sent = send(
        api,
        "m1",
        "add",
        "a",
        command_id="cmd-1",
        correlation_id="order-77",
        headers={"tenant": "acme", "trace": "t-1"},
    ).json()
    expected = {
        "command_id": "cmd-1",
        "correlation_id": "order-77",
        "causation_id": "cmd-1",
        "headers": {"tenant": "acme", "trace": "t-1"},
    }
    assert sent["events"][0]["metadata"] == expected
    read = api.get("/streams/m1").json()["events"][0]
    assert read["metadata"] == expected
    plain = send(api, "m1", "complete", "a").json()["events"][0]["metadata"]  # no ids sent: one new id for both
    assert plain["correlation_id"] == plain["causation_id"] and len(plain["causation_id"]) == 36
    assert set(plain) == {"correlation_id", "causation_id"}
    too_many = send(api, "m1", "add", "x", headers={f"h{i}": "v" for i in range(33)})
    assert too_many.status_code == 422
    reserved = send(api, "m1", "add", "x", headers={"correlation_id": "sneaky"})
    assert reserved.status_code == 422 and reserved.json()["field"] == "headers.correlation_id"
    assert send(api, "m1", "add", "x", headers={"n": 1}).status_code == 422  # values are strings

    assert cli("init", "--config", str(config)).returncode == 0
    captured = cli("capture", "--config", str(config), "--until-idle", "2")
    assert captured.returncode == 0, captured.stderr
    logged = {orjson.loads(r.value)["version"]: r for r in records(tmp_path / "log", "events.tasklist")}
    assert orjson.loads(logged[1].headers or b"null") == {
        "event_id": orjson.loads(logged[1].value)["id"],  # the consumer's dedupe key
        "tenant": "acme",
        "trace": "t-1",
        "command_id": "cmd-1",
        "correlation_id": "order-77",
        "causation_id": "cmd-1",
    }
    assert orjson.loads(logged[1].value)["metadata"] == expected
    assert orjson.loads(logged[2].headers or b"null") == {"event_id": orjson.loads(logged[2].value)["id"], **plain}


def test_a_client_causation_id(api: httpx.Client) -> None:
    """A command may name its cause (a process manager names the event it reacted to): the events
    carry it; the correlation id stays the command's own unless sent; the id is validated."""
    caused = send(api, "c1", "add", "a", command_id="cmd-9", causation_id="evt-41").json()
    meta = caused["events"][0]["metadata"]
    assert meta == {"command_id": "cmd-9", "correlation_id": "cmd-9", "causation_id": "evt-41"}
    assert api.get("/streams/c1").json()["events"][0]["metadata"] == meta
    chained = send(api, "c1", "complete", "a", causation_id="evt-42", correlation_id="order-1").json()
    assert chained["events"][0]["metadata"] == {"correlation_id": "order-1", "causation_id": "evt-42"}
    anonymous = send(api, "c1", "add", "b", causation_id="evt-43").json()["events"][0]["metadata"]
    assert anonymous["causation_id"] == "evt-43" and len(anonymous["correlation_id"]) == 36
    for bad in ("", "x" * 201, 7):
        refused = send(api, "c1", "add", "z", causation_id=bad)
        assert refused.status_code == 422, bad
    assert send(api, "c1", "add", "z", causation_id="nul\x00").status_code == 422
    assert [e["version"] for e in api.get("/streams/c1").json()["events"]] == [1, 2, 3]
    schema = api.get("/openapi.json").json()["components"]["schemas"]["CommandRequest"]["properties"]
    assert {alt.get("maxLength") for alt in schema["causation_id"]["anyOf"]} == {200, None}
    assert "caused" in schema["causation_id"]["description"]


def test_all_and_the_streams_of_a_type(api: httpx.Client) -> None:
    order: list[tuple[str, int]] = []
    for i in range(12):
        reply = send(api, f"list-{i % 4}", "add", f"t{i}").json()
        order.append((reply["stream_id"], reply["version"]))
    paged, after = [], 0
    while True:
        page = api.get("/all", params={"after": after, "limit": 5}).json()
        if not page["events"]:
            assert page["next"] == after
            break
        paged += page["events"]
        after = page["next"]
    assert [(e["stream"], e["version"]) for e in paged] == order
    assert api.get("/all", params={"type": "tasklist", "after": paged[3]["position"]}).json()["events"] == paged[4:]
    assert api.get("/all", params={"type": "nothing"}).json() == {"events": [], "next": 0}
    missing = api.get("/all", params={"after": 10**9})
    assert missing.status_code == 404 and missing.json()["code"] == "unknown_position"

    first = api.get("/streams", params={"type": "tasklist", "limit": 3}).json()
    assert [s["stream_id"] for s in first["streams"]] == ["list-0", "list-1", "list-2"]
    assert first["streams"][0]["version"] == 3 and first["next"] == "list-2"
    rest = api.get("/streams", params={"type": "tasklist", "limit": 3, "after": first["next"]}).json()
    assert [s["stream_id"] for s in rest["streams"]] == ["list-3"] and rest["next"] is None

    back = api.get("/streams/list-0", params={"direction": "backwards", "limit": 2}).json()["events"]
    assert [e["version"] for e in back] == [3, 2]
    back = api.get("/streams/list-0", params={"direction": "backwards", "from_version": 1}).json()["events"]
    assert [e["version"] for e in back] == [1]
    assert api.get("/streams/nope", params={"direction": "backwards"}).status_code == 404
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/all", "/all/subscribe", "/streams"} <= set(paths)
