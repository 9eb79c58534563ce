"""Property: after any sequence of appends, commits (whole or up to a mark), rolls (tiny segments),
compactions and reopenings, reads show exactly the committed data, compacted as promised."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tributary.log.local import Log, TopicConfig, canonical_json

pytestmark = pytest.mark.unit

PARTS = 2
RETENTION = 50  # delete_retention_ms of the compacted topic

record = st.tuples(st.integers(0, 5), st.booleans(), st.integers(0, 3))  # key, tombstone?, ts step
ops = st.one_of(
    st.tuples(st.just("append"), st.integers(0, PARTS - 1), st.lists(record, min_size=1, max_size=8)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("commit_mark"), st.integers(0, PARTS - 1), st.lists(record, min_size=1, max_size=4)),
    st.tuples(st.just("compact"), st.integers(0, 120)),
    st.tuples(st.just("reopen")),
)


@dataclass
class Model:
    committed: list[list[tuple[int, bytes, bytes | None, int]]] = field(
        default_factory=lambda: [[] for _ in range(PARTS)]
    )
    pending: list[list[tuple[int, bytes, bytes | None, int]]] = field(
        default_factory=lambda: [[] for _ in range(PARTS)]
    )
    ts: int = 0
    now: int = 0  # the latest compaction time
    value_seq: int = 0

    def make(self, p: int, spec: list[tuple[int, bool, int]]) -> list[tuple[bytes, bytes | None, int, None]]:
        out = []
        for key, tomb, step in spec:
            self.ts += step
            self.value_seq += 1
            k = canonical_json({"k": key})
            v = None if tomb else canonical_json({"v": self.value_seq})
            off = len(self.committed[p]) + len(self.pending[p])
            self.pending[p].append((off, k, v, self.ts))
            out.append((k, v, self.ts, None))
        return out

    def commit(self) -> None:
        for p in range(PARTS):
            self.committed[p] += self.pending[p]
            self.pending[p] = []


def open_log(root: Path) -> Log:
    return Log.open(root, writer=True, segment_bytes=220, index_interval_bytes=60)


def check(log: Log, root: Path, m: Model) -> None:
    assert log.end_offsets("c") == [len(m.committed[p]) for p in range(PARTS)]
    with Log.open(root) as reader:
        assert reader.end_offsets("c") == log.end_offsets("c")
        for p in range(PARTS):
            got = list(reader.read("c", p))
            offs = [r.offset for r in got]
            assert offs == sorted(set(offs)), "offsets strictly increase"
            by_off = {o: (k, v, ts) for o, k, v, ts in m.committed[p]}
            for r in got:  # nothing uncommitted or invented, every byte as written
                assert by_off[r.offset] == (r.key, r.value, r.timestamp)
            latest: dict[bytes, tuple[int, bytes | None, int]] = {}
            for o, k, v, ts in m.committed[p]:
                latest[k] = (o, v, ts)
            present = set(offs)
            for _k, (o, v, ts) in latest.items():
                if v is not None or m.now - ts < RETENTION:
                    assert o in present, "a key's latest record was lost"
            seen: dict[bytes, bytes | None] = {}
            for r in got:
                assert r.key is not None
                seen[r.key] = r.value
            assert {k: v for k, v in seen.items() if v is not None} == {
                k: v for k, (_o, v, _t) in latest.items() if v is not None
            }
            # a read from any offset starts at the first present offset at or after it
            if offs:
                mid = offs[len(offs) // 2] - 1
                assert [r.offset for r in reader.read("c", p, mid)] == [o for o in offs if o >= mid]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=18))
def test_any_history_reads_back_committed_compacted_data(history: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "log"
        log = open_log(root)
        log.create_topic("c", TopicConfig(partitions=PARTS, policy="compact", delete_retention_ms=RETENTION))
        m = Model()
        try:
            for op in history:
                if op[0] == "append":
                    log.append("c", op[1], m.make(op[1], op[2]))
                elif op[0] == "commit":
                    log.commit()
                    m.commit()
                elif op[0] == "commit_mark":
                    mark = log.mark()
                    before = [list(x) for x in m.pending]
                    log.append("c", op[1], m.make(op[1], op[2]))
                    log.commit(upto=mark)
                    for p in range(PARTS):
                        m.committed[p] += before[p]
                        m.pending[p] = m.pending[p][len(before[p]) :]
                elif op[0] == "compact":
                    m.now = max(m.now, m.ts + op[1])
                    log.compact(now_ms=m.now)
                else:
                    log.close()
                    log = open_log(root)
                    m.pending = [[] for _ in range(PARTS)]
                check(log, root, m)
            # appends continue at the next offset after everything
            for p in range(PARTS):
                expected = len(m.committed[p]) + len(m.pending[p])
                assert log.append("c", p, m.make(p, [(0, False, 1)])) == expected
            log.commit()
            m.commit()
            check(log, root, m)
            assert log.verify() == []
        finally:
            log.close()
