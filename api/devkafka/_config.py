"""The files a KRaft node starts from: pure text, so what a node runs with is read in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOG4J2", "NodeAddress", "server_properties"]

# The broker logs at INFO to stdout (redirected to the node's server.log): enough to see why it stopped.
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = WARN
"""


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """One node of the cluster: a broker and a controller in one process, on loopback."""

    node_id: int
    port: int
    controller_port: int


def server_properties(node: NodeAddress, voters: list[NodeAddress], log_dir: Path) -> str:
    """`server.properties` of `node` in a cluster of `voters` (every node is a controller too).

    Internal topics and new topics get min(3, nodes) replicas and min.insync.replicas one less
    (2 of 3): a cluster of three loses a node without refusing writes or losing acknowledged ones.
    Threads and internal partitions are few: it runs on a developer's or CI's machine."""
    replicas = min(3, len(voters))
    min_isr = max(1, replicas - 1)
    quorum = ",".join(f"{v.node_id}@127.0.0.1:{v.controller_port}" for v in voters)
    lines = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": quorum,
        "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": log_dir,
        "num.partitions": 3,
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 5,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": 5,
        "group.initial.rebalance.delay.ms": 0,
        "num.network.threads": 2,
        "num.io.threads": 2,
        "background.threads": 2,
        "log.cleaner.threads": 1,
        "num.replica.fetchers": 1,
        "num.recovery.threads.per.data.dir": 1,
        "auto.create.topics.enable": "false",
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())
