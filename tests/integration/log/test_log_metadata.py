"""Missing metadata is never an empty log: segments without a manifest (or a topic the manifest
does not list) are refused by every open, `repair` rebuilds the manifest from them, and the admin
operations never create a log root."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tributary.log.local import Log, LogError, Record, TopicConfig, admin, canonical_json

pytestmark = pytest.mark.integration

TOPICS = {
    "shop.public.orders": TopicConfig(partitions=2, policy="compact"),
    "shop.messages": TopicConfig(partitions=1, policy="delete", retention_ms=10_000),
}


def rec(i: int, key: dict[str, object] | None = None) -> tuple[bytes, bytes, int, None]:
    return (canonical_json(key or {"id": i % 5}), canonical_json({"n": i, "pad": "x" * 30}), 1000 + i, None)


def build(root: Path) -> None:
    """Two topics over several segments, one partition's start moved by retention, positions."""
    with Log.open(root, writer=True, segment_bytes=400) as log:
        for name, cfg in TOPICS.items():
            log.create_topic(name, cfg)
        for i in range(40):
            r = rec(i)
            log.append("shop.public.orders", log.partition_for("shop.public.orders", r[0]), [r])
        log.append("shop.messages", 0, [rec(i) for i in range(30)])
        log.commit(positions={"shop": "0/16B3748"})
        assert log.enforce_retention(now_ms=1_000_000) > 0  # messages' start moves past 0
        log.append("shop.messages", 0, [rec(100)])
        log.commit()


def everything(root: Path) -> list[Record]:
    with Log.open(root) as log:
        return [r for t, cfg in sorted(log.topics().items()) for p in range(cfg.partitions) for r in log.read(t, p)]


def files(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*.log"))}


def manifest_doc(root: Path) -> dict[str, object]:
    doc = orjson.loads((root / "manifest.json").read_bytes())
    doc.pop("generation")
    return doc


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "log"
    build(root)
    return root


def one_line_naming_the_fix(exc: BaseException, root: Path) -> None:
    msg = str(exc)
    assert "\n" not in msg and str(root) in msg
    assert f"tributary log verify --repair --root {root}" in msg


def test_segments_without_a_manifest_are_refused_by_every_open(root: Path) -> None:
    before = files(root)
    (root / "manifest.json").unlink()
    opens = [
        lambda: Log.open(root),
        lambda: Log.open(root, writer=True),  # capture's open: it would cut the segments away
        lambda: admin.topics(root),
        lambda: admin.cat(root, "shop.public.orders"),
        lambda: admin.verify(root),
        lambda: admin.compact(root),
    ]
    for open_ in opens:
        with pytest.raises(LogError, match="no manifest.json") as info:
            open_()
        one_line_naming_the_fix(info.value, root)
    assert files(root) == before and not (root / "manifest.json").exists()


def test_a_topic_the_manifest_does_not_list_is_refused_then_added_by_repair(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with Log.open(root, writer=True) as log:
        log.create_topic("a", TopicConfig(partitions=1))
        log.append("a", 0, [rec(0)])
        log.commit(positions={"shop": "0/10"})
    older = (root / "manifest.json").read_bytes()
    with Log.open(root, writer=True) as log:
        log.create_topic("b", TopicConfig(partitions=3, policy="none"))
        for p in range(3):
            log.append("b", p, [rec(p), rec(p + 3)])
        log.commit(positions={"shop": "0/20"})
    records, full = everything(root), manifest_doc(root)
    (root / "manifest.json").write_bytes(older)  # an older copy restored: b is unknown to it
    for writer in (False, True):
        with pytest.raises(LogError, match="holds topic\\(s\\) b with segment files") as info:
            Log.open(root, writer=writer)
        one_line_naming_the_fix(info.value, root)
    notes = admin.repair(root)
    assert any("b: rebuilt 3 partition(s)" in n for n in notes)
    assert everything(root) == records
    doc = manifest_doc(root)
    assert doc["topics"] == full["topics"]
    assert doc["positions"] == {"shop": "0/10"}  # the manifest's own position is kept, not guessed


def test_repair_rebuilds_the_manifest_from_the_segments(root: Path) -> None:
    records, original = everything(root), manifest_doc(root)
    assert len({r.offset for r in records if r.topic == "shop.messages"}) < 31  # retention removed some
    (root / "manifest.json").unlink()
    notes = admin.repair(root, positions_from=lambda log: {"shop": "0/1", "other": "0/2"})
    assert "manifest.json was missing: rebuilt from the segment files" in notes
    doc = manifest_doc(root)
    assert doc["topics"] == original["topics"]  # configs, starts, ends, segments, bytes
    assert doc["positions"] == {"shop": "0/1", "other": "0/2"}
    assert admin.verify(root) == []
    assert everything(root) == records
    with Log.open(root, writer=True) as log:  # appends continue after the old ends
        ends = log.end_offsets("shop.public.orders")
        assert log.append("shop.public.orders", 0, [rec(99)]) == ends[0]
        log.commit()


def test_positions_from_reads_the_rebuilt_log(root: Path) -> None:
    (root / "manifest.json").unlink()
    seen: list[int] = []

    def positions(log: Log) -> dict[str, str]:
        seen.append(sum(1 for _ in log.read("shop.messages", 0)))
        return {"shop": "0/5"}

    admin.repair(root, positions_from=positions)
    assert seen == [sum(1 for r in everything(root) if r.topic == "shop.messages")] and seen[0] > 0


def test_repair_cuts_a_torn_last_record(root: Path) -> None:
    records = everything(root)
    (root / "manifest.json").unlink()
    pdir = root / "shop.messages" / "0"
    active = sorted(pdir.glob("*.log"))[-1]
    with active.open("ab") as f:
        f.write(b'{"offset":999,"timestamp":1,"lens":[1')  # a write torn by a crash
    notes = admin.repair(root)
    assert any(n.startswith("shop.messages/0: cut a torn last record") for n in notes)
    assert everything(root) == records and admin.verify(root) == []


def test_repair_refuses_a_damaged_sealed_segment_and_says_why(root: Path) -> None:
    (root / "manifest.json").unlink()
    sealed = sorted((root / "shop.public.orders" / "0").glob("*.log"))[0]
    data = bytearray(sealed.read_bytes())
    data[20] ^= 0x01
    sealed.write_bytes(bytes(data))
    with pytest.raises(LogError, match="cannot rebuild shop.public.orders/0") as info:
        admin.repair(root)
    assert "\n" not in str(info.value) and str(sealed) in str(info.value)
    assert not (root / "manifest.json").exists()


def test_repair_without_a_topic_config_keeps_everything(root: Path) -> None:
    records = everything(root)
    (root / "manifest.json").unlink()
    (root / "shop.public.orders" / "topic.json").unlink()
    notes = admin.repair(root)
    assert any("shop.public.orders: no topic.json" in n and "policy none" in n for n in notes)
    with Log.open(root) as log:
        assert log.topic_config("shop.public.orders") == TopicConfig(partitions=2, policy="none")
    assert everything(root) == records


def test_a_reader_sees_a_vanished_manifest_as_an_error(root: Path) -> None:
    with Log.open(root) as log:
        (root / "manifest.json").unlink()
        with pytest.raises(LogError, match="no manifest.json"):
            log.refresh()


def test_an_empty_root_is_an_empty_log(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with Log.open(root, writer=True) as log:
        log.create_topic("t", TopicConfig(partitions=2))  # segments exist, but hold nothing
    (root / "manifest.json").unlink()
    with Log.open(root) as log:
        assert log.topics() == {}


@pytest.mark.parametrize("op", ["compact", "repair"])
def test_admin_ops_do_not_create_a_mistyped_root(tmp_path: Path, op: str) -> None:
    wrong = tmp_path / "lgo"
    with pytest.raises(LogError) as info:
        getattr(admin, op)(wrong)
    assert str(info.value) == f"no log at {wrong}"
    assert not wrong.exists()
    wrong.mkdir()  # an existing directory holding no log: not made one either
    with pytest.raises(LogError, match="^no log at"):
        getattr(admin, op)(wrong)
    assert list(wrong.iterdir()) == []


def test_readers_say_no_log_for_a_mistyped_root(tmp_path: Path) -> None:
    wrong = tmp_path / "lgo"
    for op in (admin.topics, admin.verify, lambda r: admin.cat(r, "t")):
        with pytest.raises(LogError) as info:
            op(wrong)
        assert str(info.value) == f"no log at {wrong}"
    assert not wrong.exists()


def test_topics_counts_schema_records_apart(tmp_path: Path) -> None:
    root = tmp_path / "log"
    schema_key = b'{"__schema__":true}'
    lookalike = b'{"x":1,"key":{"__schema__":true},"value":2}'  # a value holding the same bytes
    with Log.open(root, writer=True, segment_bytes=300) as log:
        log.create_topic("t", TopicConfig(partitions=2, policy="compact"))
        for p in range(2):
            log.append("t", p, [(schema_key, b'{"schema":{"columns":[]}}', 1, None)])
        log.append("t", 0, [rec(i) for i in range(20)])
        log.append("t", 1, [(canonical_json({"id": 1}), lookalike, 2, None), (schema_key, b'{"schema":{}}', 3, None)])
        log.commit()
        log.append("t", 1, [(schema_key, b'{"schema":{}}', 4, None)])  # never committed
    (row,) = admin.topics(root)
    assert (row["records"], row["data_records"], row["schema_records"]) == (24, 21, 3)
    assert sum(1 for r in everything(root) if r.key == schema_key) == 3


def test_the_schema_key_is_captures() -> None:
    from tributary.capture.records.schema_tracker import SCHEMA_KEY

    assert admin.SCHEMA_KEY == SCHEMA_KEY


def test_get_topics_answers_503_with_the_repair_line(root: Path) -> None:
    import asyncio

    import httpx

    from tributary.api.http.app import create_app
    from tributary.api.settings.config import Settings

    settings = Settings.model_validate(
        {"log": {"root": str(root)}, "api": {"keys": [{"key": "k-admin-123", "scopes": ["admin"]}]}}
    )
    app = create_app(settings, dsn="postgresql://127.0.0.1:1/none")  # /topics needs no database

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get("/topics", headers={"Authorization": "Bearer k-admin-123"})

    assert asyncio.run(get()).status_code == 200
    (root / "manifest.json").unlink()
    res = asyncio.run(get())
    assert res.status_code == 503, res.text  # it answered [] ("nothing captured yet")
    one_line_naming_the_fix(Exception(res.json()["detail"]), root)


def test_topics_counts_stay_right_in_a_process_that_asks_again(tmp_path: Path) -> None:
    root = tmp_path / "log"
    schema = (b'{"__schema__":true}', b'{"schema":{}}', 1, None)

    def counts() -> tuple[object, object]:
        (row,) = admin.topics(root)
        return row["records"], row["schema_records"]

    with Log.open(root, writer=True, segment_bytes=2000) as log:
        log.create_topic("t", TopicConfig(partitions=1, policy="compact"))
        log.append("t", 0, [schema, *(rec(i) for i in range(5))])
        log.commit()
        assert counts() == (6, 1)
        log.append("t", 0, [schema, *(rec(i) for i in range(30))])  # the first segment rolls
        log.commit()
        assert counts() == (37, 2)
        log.append("t", 0, [rec(99), schema])
        log.commit()
        assert counts() == (39, 3)
        active = log.partition_state("t", 0).segment
    path = root / "t" / "0" / f"{active:020d}.log"
    path.write_bytes(path.read_bytes()[:-10])  # the committed tail torn: repair cuts one record
    admin.repair(root)
    with Log.open(root, writer=True) as log:  # new records where the cut one was, past the bytes counted
        log.append("t", 0, [rec(7), rec(8), schema])
        log.commit()
    assert counts() == (41, 3)
    assert counts() == (len(everything(root)), sum(1 for r in everything(root) if r.key == schema[0]))
