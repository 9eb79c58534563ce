"""Key → partition must match Kafka's default partitioner and never depend on the process."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.log.local import partitioner
from tributary.log.local.partitioner import (
    canonical_json,
    murmur2,
    partition_for,
    split_partitions,
    split_partitions_python,
)

pytestmark = pytest.mark.unit

# Kafka's own vectors: UtilsTest.testMurmur2 in
# clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"", 275646681),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected
    assert murmur2_reference(data) == expected


def murmur2_reference(data: bytes) -> int:
    """Kafka's `Utils.murmur2` transcribed line by line (the test's own reference, every tail length)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    end4 = length & ~3
    for (k,) in struct.iter_unpack("<I", data[:end4]):
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[end4 + 2] << 16
    if rest >= 2:
        h ^= data[end4 + 1] << 8
    if rest >= 1:
        h ^= data[end4]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@given(st.binary(max_size=200), st.integers(min_value=1, max_value=1000))
def test_the_hash_is_kafkas_for_every_length(data: bytes, partitions: int) -> None:
    assert murmur2(data) == murmur2_reference(data)
    assert partition_for(data, partitions) == (murmur2_reference(data) & 0x7FFFFFFF) % partitions


def test_partition_is_kafkas_to_positive_mod() -> None:
    # toPositive(-790332482) = 1357151166; 1357151166 % 50 = 16
    assert partition_for(b"foobar", 50) == 16
    assert all(0 <= partition_for(d, 7) < 7 for d, _ in KAFKA_VECTORS)


def test_none_key_goes_to_partition_zero_and_bad_count_is_refused() -> None:
    assert partition_for(None, 12) == 0
    with pytest.raises(ValueError):
        partition_for(b"k", 0)


def test_canonical_json_sorts_keys_without_whitespace() -> None:
    assert canonical_json({"b": 1, "a": {"d": 2, "c": [1, 2]}}) == b'{"a":{"c":[1,2],"d":2},"b":1}'
    assert canonical_json({"b": 1, "a": 2}) == canonical_json({"a": 2, "b": 1})


# fixed table: if this changes, every existing log would route keys to other partitions
STABLE = {
    b'{"id":1}': 4,
    b'{"id":2}': 0,
    b'{"id":"A-17"}': 4,
    b'{"order_id":42,"tenant":"acme"}': 3,
}


def _table() -> dict[bytes, int]:
    return {k: partition_for(k, 8) for k in STABLE}


def test_fixed_table_is_stable() -> None:
    assert _table() == STABLE


def test_same_answer_in_another_process_with_another_hash_seed() -> None:
    code = (
        "from tributary.log.local.partitioner import partition_for, canonical_json;"
        "print([partition_for(canonical_json({'id': i}), 8) for i in range(200)])"
    )
    root = Path(__file__).resolve().parents[3]
    outs = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True, text=True)
        outs.add(out.stdout)
    here = str([partition_for(canonical_json({"id": i}), 8) for i in range(200)]) + "\n"
    assert outs == {here}


@given(keys=st.lists(st.binary(max_size=40), max_size=50), partitions=st.integers(1, 64))
def test_partitions_for_equals_partition_for_of_each_key(keys: list[bytes], partitions: int) -> None:
    assert partitioner.partitions_for(keys, partitions) == [partition_for(k, partitions) for k in keys]


@given(
    keys=st.lists(st.binary(max_size=40), max_size=60),
    partitions=st.one_of(st.integers(1, 12), st.sampled_from([0, -1, 1000])),
)
def test_split_partitions_keeps_each_partitions_order(keys: list[bytes], partitions: int) -> None:
    """Each partition's keys and values in their order, every key where `partition_for` puts it."""
    values = [b"v%d" % i for i in range(len(keys))]
    if partitions <= 0:
        with pytest.raises(ValueError):
            split_partitions(keys, values, partitions)
        return
    got = split_partitions(keys, values, partitions)
    assert len(got) == partitions
    want: list[tuple[list[bytes], list[bytes]]] = [([], []) for _ in range(partitions)]
    for k, v in zip(keys, values, strict=True):
        want[partition_for(k, partitions)][0].append(k)
        want[partition_for(k, partitions)][1].append(v)
    assert got == want


def test_split_partitions_refuses_unequal_lists() -> None:
    with pytest.raises(ValueError):
        split_partitions([b"a"], [], 2)
    assert split_partitions([], [], 3) == [([], []), ([], []), ([], [])]


def test_the_typed_split_is_built() -> None:
    """`pip install -e .` builds log/local/_typed.pyx in place: the tests run the typed path."""
    assert partitioner._typed_split is not None


@given(
    keys=st.lists(st.binary(max_size=40), max_size=60),
    partitions=st.one_of(st.integers(1, 12), st.just(1000)),
)
def test_typed_split_is_the_reference(keys: list[bytes], partitions: int) -> None:
    """log/local/_typed.pyx `split_partitions` against `split_partitions_python`: the same
    per-partition keys and values in the same order."""
    typed = partitioner._typed_split
    assert typed is not None
    values = [b"v%d" % i for i in range(len(keys))]
    want = split_partitions_python(keys, values, partitions)
    assert typed(keys, values, partitions) == want
    assert split_partitions(keys, values, partitions) == want


def test_typed_split_odd_arguments() -> None:
    typed = partitioner._typed_split
    assert typed is not None
    with pytest.raises(ValueError):
        typed([b"a"], [], 2)
    with pytest.raises(ValueError):
        typed([b"a"], [b"x"], 0)
    with pytest.raises(TypeError):
        typed(["a"], [b"x"], 2)  # type: ignore[list-item]  # murmurhash2 hashes bytes
    with pytest.raises(TypeError):
        typed((b"a",), [b"x"], 2)  # type: ignore[arg-type]


@given(keys=st.lists(st.binary(max_size=40), max_size=30))
def test_hashes_are_the_unsigned_murmur2(keys: list[bytes]) -> None:
    assert list(partitioner.hashes(keys)) == [murmur2(k) & 0xFFFFFFFF for k in keys]
