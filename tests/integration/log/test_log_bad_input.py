"""Damaged or impossible on-disk states: each gives a clear error or a clean recovery, never
silent loss."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tributary.log.local import (
    CorruptRecordError,
    DiskFullError,
    Log,
    LogError,
    LogLockedError,
    TopicConfig,
    _fileio,
    canonical_json,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def recs(start: int, n: int, pad: int = 40) -> list[tuple[bytes, bytes, int, None]]:
    return [
        (canonical_json({"id": i}), canonical_json({"n": i, "pad": "x" * pad}), i, None)
        for i in range(start, start + n)
    ]


def build(root: Path, n: int = 60) -> None:
    """Topic t/0 with several sealed segments and an active one, all committed."""
    with Log.open(root, writer=True, segment_bytes=1500, index_interval_bytes=256) as log:
        log.create_topic("t", TopicConfig(partitions=1))
        log.append("t", 0, recs(0, n))
        log.commit()


def segment(root: Path, i: int) -> Path:
    return sorted((root / "t" / "0").glob("*.log"))[i]


def test_sealed_segment_truncated_mid_record(tmp_path: Path) -> None:
    root = tmp_path / "log"
    build(root)
    seg = segment(root, 1)
    data = seg.read_bytes()
    seg.write_bytes(data[: len(data) - 30])
    with Log.open(root) as log:
        with pytest.raises(CorruptRecordError, match="truncated mid-record") as exc:
            list(log.read("t", 0))
        assert (exc.value.topic, exc.value.partition, exc.value.segment) == ("t", 0, seg.name)
        problems = log.verify()
    assert len(problems) == 1
    p = problems[0]
    assert (p.topic, p.partition, p.segment) == (
        "t",
        0,
        seg.name,
    ) and "truncated mid-record" in p.message
    assert p.offset is not None and data.count(b"\n") + int(seg.name[:20]) - 1 == p.offset


def test_flipped_bytes_in_a_sealed_segment(tmp_path: Path) -> None:
    root = tmp_path / "log"
    build(root)
    seg = segment(root, 0)
    data = bytearray(seg.read_bytes())
    third = data.index(b'{"offset":2,')
    data[third + 80] ^= 0x01  # inside record 2's value
    seg.write_bytes(bytes(data))
    with Log.open(root) as log:
        assert [r.offset for r in log.read("t", 0, to_offset=2)] == [0, 1]  # intact prefix is fine
        with pytest.raises(CorruptRecordError, match="offset 2: CRC mismatch") as exc:
            list(log.read("t", 0))
        assert exc.value.offset == 2 and exc.value.segment == seg.name
        problems = log.verify()
    assert [(p.topic, p.partition, p.segment, p.offset) for p in problems] == [("t", 0, seg.name, 2)]
    assert "CRC mismatch" in problems[0].message


def _edit_manifest(root: Path, **change: int) -> None:
    doc = orjson.loads((root / "manifest.json").read_bytes())
    for k, v in change.items():
        doc["topics"]["t"]["partitions"][0][k] += v
    (root / "manifest.json").write_bytes(orjson.dumps(doc))


def test_manifest_pointing_past_the_data(tmp_path: Path) -> None:
    root = tmp_path / "log"
    build(root)
    _edit_manifest(root, bytes=500, end=5)
    with pytest.raises(LogError, match=r"manifest points past the data: .* has \d+ bytes but \d+ are committed"):
        Log.open(root, writer=True)
    with Log.open(root) as log:
        with pytest.raises(CorruptRecordError, match="the manifest says"):
            list(log.read("t", 0))
        assert any("points past the data" in p.message for p in log.verify())
    # the failed open released the lock
    _edit_manifest(root, bytes=-500, end=-5)
    Log.open(root, writer=True).close()


def test_manifest_end_beyond_records(tmp_path: Path) -> None:
    root = tmp_path / "log"
    build(root)
    _edit_manifest(root, end=3)
    with pytest.raises(LogError, match="ends at offset 63 but its data ends at 60"):
        Log.open(root, writer=True)


def test_missing_topic_directory(tmp_path: Path) -> None:
    root = tmp_path / "log"
    build(root)
    shutil.rmtree(root / "t")
    with pytest.raises(
        LogError,
        match="partition directory .* is missing but the manifest says it holds offsets 0..59",
    ):
        Log.open(root, writer=True)
    with Log.open(root) as log:
        with pytest.raises(LogError, match="is missing"):
            list(log.read("t", 0))
        assert [p.segment for p in log.verify()] == ["-"]


def test_unreadable_manifest(tmp_path: Path) -> None:
    root = tmp_path / "log"
    build(root)
    (root / "manifest.json").write_bytes(b'{"format": 1, "topics": ')
    with pytest.raises(LogError, match="manifest .*manifest.json is unreadable"):
        Log.open(root)


@pytest.fixture(params=["tmpfs", "injected"])
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, str]]:
    """A 1 MiB tmpfs if we may mount one (we run as root in CI), and in any case ENOSPC injected
    at the file layer (`_fileio.os_write`) after 1 MiB."""
    mnt = tmp_path / f"tiny-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    ok = (
        request.param == "tmpfs"
        and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode
        == 0
    )
    if ok:
        try:
            yield mnt, "tmpfs"
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
        return
    real = _fileio.os_write
    budget = [1 << 20]

    def limited(fd: int, data: bytes | memoryview) -> int:
        if budget[0] < len(data):
            raise OSError(28, "No space left on device")
        budget[0] -= len(data)
        return real(fd, data)

    _fileio.os_write = limited
    try:
        yield mnt, "injected"
    finally:
        _fileio.os_write = real


def test_full_disk_keeps_the_committed_state(small_disk: tuple[Path, str]) -> None:
    root = small_disk[0] / "log"
    log = Log.open(root, writer=True, segment_bytes=200_000)
    log.create_topic("t", TopicConfig(partitions=2))
    committed = [0, 0]
    with pytest.raises(DiskFullError, match="disk full while .*nothing new was committed"):
        for i in range(1000):
            p = i % 2
            log.append("t", p, recs(committed[p], 50, pad=200))
            log.commit(positions={"src": str(i)})
            committed[p] += 50
    # the committed state is intact and the log is usable again (uncommitted appends dropped)
    assert log.end_offsets("t") == committed
    assert [r.offset for r in log.read("t", 0)] == list(range(committed[0]))
    last = log.positions()["src"]
    log.close()
    with Log.open(root, writer=True) as again:
        assert again.end_offsets("t") == committed and again.positions()["src"] == last
        assert again.verify() == []
        assert again.append("t", 1, recs(committed[1], 1)) == committed[1]


def test_second_writer_process_is_refused_until_the_first_is_killed(tmp_path: Path) -> None:
    root = tmp_path / "log"
    code = (
        "import sys, time; from pathlib import Path; from tributary.log.local import Log;"
        "Log.open(Path(sys.argv[1]), writer=True); print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(root)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"locked\n"
        with pytest.raises(
            LogLockedError,
            match=rf"log root .* is locked by pid {proc.pid} \(another tributary capture\?\)",
        ):
            Log.open(root, writer=True)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    from tests.waiting import wait_progress

    def opened() -> bool:
        try:
            Log.open(root, writer=True).close()
        except LogLockedError:
            return False
        return True

    wait_progress(opened, lambda: None, what="kill -9 to release the lock", poll=0.05)


def test_repair_cuts_a_damaged_tail_and_never_reuses_offsets(tmp_path: Path) -> None:
    root = tmp_path / "log"
    build(root)
    active = segment(root, -1)
    data = active.read_bytes()
    active.write_bytes(data[: len(data) - 50])  # the committed tail is torn
    with pytest.raises(LogError, match="manifest points past the data"):
        Log.open(root, writer=True)
    with Log.open(root, writer=True, repair=True) as log:
        assert len(log.repaired) == 1 and "offsets 59..59 lost" in log.repaired[0]
        assert log.end_offsets("t") == [60]
        assert [r.offset for r in log.read("t", 0)] == list(range(59))
        assert log.append("t", 0, recs(60, 1)) == 60  # 59 stays a gap, never reused
        log.commit()
        assert log.verify() == []
    with Log.open(root, writer=True) as log:  # a plain open works again
        assert [r.offset for r in log.read("t", 0, 57)] == [57, 58, 60]


def test_repair_of_a_missing_partition_directory(tmp_path: Path) -> None:
    root = tmp_path / "log"
    build(root)
    shutil.rmtree(root / "t" / "0")
    with Log.open(root, writer=True, repair=True) as log:
        assert "offsets 0..59 lost" in log.repaired[0]
        assert list(log.read("t", 0)) == [] and log.append("t", 0, recs(0, 1)) == 60
