"""The `tombstones` policy (the event store's topics): every record is kept, except that a key's
tombstone removes the key's earlier records; a key used again after it keeps its new records."""

from __future__ import annotations

from pathlib import Path

import pytest

from tributary.log.local import Log, TopicConfig
from tributary.log.local.compaction import keep_untombstoned

pytestmark = pytest.mark.unit


def _rec(stream: str, n: int, *, tombstone: bool = False) -> tuple[bytes, bytes | None, int, None]:
    value = None if tombstone else f'{{"stream":"{stream}","version":{n}}}'.encode()
    return (f'"{stream}"'.encode(), value, 1_000 + n, None)


def test_the_rule() -> None:
    tombs = {b'"a"': 5}
    assert keep_untombstoned(1, 0, b'"b"', False, tombs, 0, 100)  # never deleted: kept
    assert keep_untombstoned(1, 0, None, False, tombs, 0, 100)  # no key: kept
    assert not keep_untombstoned(4, 0, b'"a"', False, tombs, 0, 100)  # before its tombstone: gone
    assert keep_untombstoned(6, 0, b'"a"', False, tombs, 0, 100)  # used again after it: kept
    assert keep_untombstoned(5, 0, b'"a"', True, tombs, 50, 100)  # the tombstone, within retention
    assert not keep_untombstoned(5, 0, b'"a"', True, tombs, 1_000, 100)  # then gone


def test_a_tombstone_removes_its_key_and_nothing_else(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True, segment_bytes=300) as log:
        log.create_topic("events.account", TopicConfig(partitions=1, policy="tombstones", delete_retention_ms=100))
        history = [_rec(s, n) for n in range(1, 6) for s in ("keep", "gone", "again")]
        log.append("events.account", 0, history)
        log.append("events.account", 0, [_rec("gone", 0, tombstone=True), _rec("again", 0, tombstone=True)])
        log.append("events.account", 0, [_rec("again", 6), _rec("again", 7)])
        log.append("events.account", 0, [_rec("keep", 6)])  # so the rest sits in sealed segments
        log.append("events.account", 0, [_rec("keep", 7)])
        log.commit()
        before = list(log.read("events.account", 0))
        stats = log.compact("events.account", now_ms=1_050)
        assert stats.records_after < stats.records_before
        after = [(r.key, r.value) for r in log.read("events.account", 0)]
        kept = {r.offset for r in log.read("events.account", 0)}
        assert [v for k, v in after if k == b'"keep"'] == [r.value for r in before if r.key == b'"keep"']
        assert [v for k, v in after if k == b'"gone"'] == [None]  # its tombstone, within retention
        again = [v for k, v in after if k == b'"again"']
        assert again == [None, b'{"stream":"again","version":6}', b'{"stream":"again","version":7}']
        assert kept <= {r.offset for r in before}
        log.compact("events.account", now_ms=100_000)
        keys = {r.key for r in log.read("events.account", 0)}
        assert b'"gone"' not in keys and b'"keep"' in keys
        assert log.verify() == []
