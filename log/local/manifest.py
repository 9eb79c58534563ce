"""The manifest: the committed state of the whole log, as one JSON document (codec is pure).

Per partition: `start` (first offset kept by retention), `end` (next offset: everything below is
committed), `segment` (base offset of the segment the committed data ends in) and `bytes` (its
committed length). Plus every topic's config and the source positions (opaque strings by name).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from tributary.log.local.errors import LogError
from tributary.log.local.types import TopicConfig

__all__ = [
    "MANIFEST",
    "FORMAT",
    "Manifest",
    "PartitionState",
    "TopicState",
    "decode_manifest",
    "encode_manifest",
    "read_manifest",
]

MANIFEST = "manifest.json"
FORMAT = 1


@dataclass(frozen=True, slots=True)
class PartitionState:
    start: int = 0
    end: int = 0
    segment: int = 0
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class TopicState:
    config: TopicConfig
    partitions: tuple[PartitionState, ...]


@dataclass(frozen=True, slots=True)
class Manifest:
    generation: int = 0
    topics: dict[str, TopicState] = field(default_factory=dict)
    positions: dict[str, str] = field(default_factory=dict)

    def partition(self, topic: str, partition: int) -> PartitionState:
        return self.topics[topic].partitions[partition]

    def with_topic(self, name: str, state: TopicState) -> Manifest:
        return replace(self, topics={**self.topics, name: state})


def encode_manifest(m: Manifest) -> bytes:
    doc = {
        "format": FORMAT,
        "generation": m.generation,
        "positions": m.positions,
        "topics": {
            name: {
                "config": t.config.to_dict(),
                "partitions": [
                    {"start": p.start, "end": p.end, "segment": p.segment, "bytes": p.nbytes} for p in t.partitions
                ],
            }
            for name, t in m.topics.items()
        },
    }
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)


def decode_manifest(data: bytes, source: str = MANIFEST) -> Manifest:
    """Parse and validate; any problem is a LogError naming the file."""
    try:
        doc: Any = orjson.loads(data)
        if doc.get("format") != FORMAT:
            raise ValueError(f"unsupported format {doc.get('format')!r} (this version reads {FORMAT})")
        topics = {
            name: TopicState(
                config=TopicConfig.from_dict(t["config"]),
                partitions=tuple(
                    PartitionState(int(p["start"]), int(p["end"]), int(p["segment"]), int(p["bytes"]))
                    for p in t["partitions"]
                ),
            )
            for name, t in doc["topics"].items()
        }
        positions = {str(k): str(v) for k, v in doc.get("positions", {}).items()}
        return Manifest(generation=int(doc["generation"]), topics=topics, positions=positions)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LogError(f"manifest {source} is unreadable: {exc}") from exc


def read_manifest(root: Path) -> Manifest | None:
    """The committed manifest, or None if the log has never committed anything."""
    path = root / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_manifest(data, str(path))
