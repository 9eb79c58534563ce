"""A group whose parked topic `<group>.parked` would be capture's (a configured source's `<source>.`
namespace, the event store's `events.`) or a topic another writer owns is refused at join, over HTTP
(409 `parked_topic_taken`, naming the topic and its owner) and in-process; a park that meets such a
topic after the join gets the same answer, not a 503."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.consumers.helpers import Filler
from tests.integration.consumers.test_coordinator import log_root, service  # noqa: F401
from tributary.api.http.app import create_app
from tributary.api.settings.config import LogSettings, Settings, SourceSettings
from tributary.consumers import GroupCoordinator

pytestmark = pytest.mark.integration

TOPIC = "shop.public.items"


@asynccontextmanager
async def _client(dsn: str, root: Path, sources: tuple[str, ...]) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        log=LogSettings(root=root), sources=tuple(SourceSettings(name=s, dsn="postgresql://unused/db") for s in sources)
    )
    app = create_app(settings, dsn=dsn)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


async def _join(client: httpx.AsyncClient, group: str) -> httpx.Response:
    body = {"topics": [TOPIC], "member_id": "m", "auto_offset_reset": "earliest", "session_timeout_ms": 60_000}
    return await client.post(f"/groups/{group}/members", json=body)


def _fill(root: Path, *topics: str) -> None:
    """The log with TOPIC holding a few records, and `topics` created by the default writer (capture)."""
    f = Filler(root)
    try:
        for t in (TOPIC, *topics):
            f.topic(t, partitions=1)
        f.write(TOPIC, [(f"k{i}", {"n": i}) for i in range(3)])
    finally:
        f.close()


def _problem(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_group_whose_parked_topic_is_a_capture_topic_is_refused_at_join(service: str, log_root: Path) -> None:  # noqa: F811
    _fill(log_root, "shop.public.parked")

    async def go() -> None:
        async with _client(service, log_root, ()) as client:
            r = await _join(client, "shop.public")
            assert r.status_code == 409, r.text
            p = _problem(r)
            assert p["code"] == "parked_topic_taken"
            assert "'shop.public.parked'" in p["detail"] and "capture" in p["detail"] and "\n" not in p["detail"]
            assert (await _join(client, "ledger")).status_code == 200

    asyncio.run(go())


def test_a_parked_topic_in_a_sources_namespace_is_refused_before_capture_made_it(service: str, log_root: Path) -> None:  # noqa: F811
    _fill(log_root)

    async def go() -> None:
        async with _client(service, log_root, ("shop",)) as client:
            for group in ("shop.public", "shop", "events"):
                r = await _join(client, group)
                assert r.status_code == 409, (group, r.text)
                p = _problem(r)
                assert p["code"] == "parked_topic_taken" and f"'{group}.parked'" in p["detail"], p
            assert (await _join(client, "shopkeepers")).status_code == 200

    asyncio.run(go())


def test_a_park_into_a_topic_capture_took_after_the_join_is_a_conflict(service: str, log_root: Path) -> None:  # noqa: F811
    _fill(log_root)

    async def go() -> None:
        async with _client(service, log_root, ()) as client:
            r = await _join(client, "shop.public")
            assert r.status_code == 200, r.text
            _fill(log_root, "shop.public.parked")  # capture starts a table `public.parked` meanwhile
            ref = {"topic": TOPIC, "partition": 0, "offset": 0}
            body = {"generation": r.json()["generation"], "records": [ref], "reason": "no"}
            r = await client.post("/groups/shop.public/members/m/park", json=body)
            assert r.status_code == 409, r.text
            assert _problem(r)["code"] == "parked_topic_taken"

    asyncio.run(go())


def test_the_coordinator_refuses_the_join_in_one_line(service: str, log_root: Path) -> None:  # noqa: F811
    from tributary.consumers import ParkedTopicTaken

    _fill(log_root)
    with GroupCoordinator(service, log_root, poll_interval_ms=0, capture_sources=("shop",)) as c:
        with pytest.raises(ParkedTopicTaken) as caught:
            c.join("shop.public", [TOPIC])
        assert str(caught.value).count("\n") == 0 and "'shop.public.parked'" in str(caught.value)
        assert c.groups() == []  # nothing of the refused group stays
