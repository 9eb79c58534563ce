"""A local Kafka node's server.properties: a cluster of three keeps writing through the loss of one
node (3 replicas, 2 in sync), one node asks for no replica it cannot have."""

from __future__ import annotations

from pathlib import Path

import pytest

from tributary.api.devkafka._config import NodeAddress, server_properties

pytestmark = pytest.mark.unit


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def test_three_nodes_replicate_thrice_and_need_two_in_sync() -> None:
    nodes = [NodeAddress(i, 9000 + i, 9100 + i) for i in (1, 2, 3)]
    props = _props(server_properties(nodes[1], nodes, Path("/d")))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9002"
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
    ):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert props["log.dirs"] == "/d"


def test_one_node_asks_for_one_replica() -> None:
    node = NodeAddress(1, 9092, 9093)
    props = _props(server_properties(node, [node], Path("/d")))
    assert props["offsets.topic.replication.factor"] == props["transaction.state.log.replication.factor"] == "1"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "1"
    assert props["process.roles"] == "broker,controller"
