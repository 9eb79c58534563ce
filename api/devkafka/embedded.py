"""The local Kafka behind `tributary kafka up|down|status` and the tests' brokers.

Apache Kafka's own broker (the `kafka_2.13` jars that `make setup` copies from Maven Central into
build/kafka/lib, see deploy/kafka/pom.xml) run by `java` in KRaft mode on loopback: one node, or
several (each a broker and a controller) for tests that kill nodes. The nodes' ports, process ids
and cluster id live in `tributary-kafka.json` under the data directory, so `down` and `status` work
from another process than `up`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tributary.api.devdb.embedded import free_port
from tributary.api.devkafka._config import LOG4J2, NodeAddress, server_properties

__all__ = ["DEFAULT_LIB_DIR", "BrokerError", "EmbeddedKafka"]

DEFAULT_LIB_DIR = Path(__file__).resolve().parents[2] / "build" / "kafka" / "lib"
PREFERRED_PORT = 9092
_STATE = "tributary-kafka.json"
_JVM = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]
_STALL_S = 60.0  # a node whose log has not grown for this long while not ready is stuck
_CEILING_S = 600.0


class BrokerError(Exception):
    """The local Kafka cannot be set up, started or reached; the message says what to do."""


@dataclass(frozen=True, slots=True)
class _State:
    cluster_id: str
    nodes: list[NodeAddress]
    pids: dict[int, int]  # node id -> process id; absent while the node is stopped


class EmbeddedKafka:
    """A KRaft cluster of `brokers` nodes under `data_dir` (default `.tributary/kafka`)."""

    def __init__(self, data_dir: Path, *, brokers: int = 1, lib_dir: Path | None = None, heap: str = "512m") -> None:
        self.data_dir = data_dir.absolute()
        self.brokers = brokers
        self.lib_dir = (lib_dir or DEFAULT_LIB_DIR).absolute()
        self._heap = heap
        self._procs: dict[int, subprocess.Popen[bytes]] = {}  # nodes started by this object: reaped here

    # -- state --------------------------------------------------------------------
    def _state(self) -> _State | None:
        path = self.data_dir / _STATE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return _State(
            cluster_id=raw["cluster_id"],
            nodes=[NodeAddress(**n) for n in raw["nodes"]],
            pids={int(k): int(v) for k, v in raw["pids"].items()},
        )

    def _write_state(self, state: _State) -> None:
        doc = {"cluster_id": state.cluster_id, "nodes": [asdict(n) for n in state.nodes], "pids": state.pids}
        tmp = self.data_dir / (_STATE + ".tmp")
        tmp.write_text(json.dumps(doc) + "\n")
        os.replace(tmp, self.data_dir / _STATE)

    def _require(self) -> _State:
        state = self._state()
        if state is None:
            raise BrokerError(f"no local Kafka in {self.data_dir}: run `tributary kafka up`")
        return state

    # -- paths ----------------------------------------------------------------------
    def node_dir(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}"

    def log_file(self, node_id: int) -> Path:
        """The node's own log (stdout and stderr of its JVM)."""
        return self.node_dir(node_id) / "server.log"

    def classpath(self) -> str:
        jars = sorted(self.lib_dir.glob("*.jar"))
        if not any(j.name.startswith("kafka_2.13-") for j in jars):
            raise BrokerError(f"Apache Kafka's jars are not in {self.lib_dir}: run `make setup`")
        return ":".join(str(j) for j in jars)

    def _java(self, *args: str) -> list[str]:
        jvm = [a if not a.startswith("-Xmx") else f"-Xmx{self._heap}" for a in _JVM]
        log4j = self.data_dir / "log4j2.properties"
        return ["java", *jvm, f"-Dlog4j2.configurationFile={log4j}", "-cp", self.classpath(), *args]

    # -- lifecycle --------------------------------------------------------------------
    def up(self, *, port: int | None = None) -> str:
        """Format on first use, start every stopped node, wait until each answers; return the bootstraps."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        state = self._state()
        if state is None:
            state = _State(cluster_id=_cluster_id(), nodes=self._addresses(port), pids={})
            self._write_state(state)
        elif port is not None and port != state.nodes[0].port:
            raise BrokerError(f"the local Kafka in {self.data_dir} listens on port {state.nodes[0].port}, not {port}")
        (self.data_dir / "log4j2.properties").write_text(LOG4J2)
        for node in state.nodes:
            if not self.node_alive(node.node_id):
                self.start_node(node.node_id)
        self.wait_ready()
        return self.bootstraps

    def _addresses(self, port: int | None) -> list[NodeAddress]:
        """Free ports for every node: `port` (or 9092 when free, for one node) for the first broker."""
        first = port or (free_port(PREFERRED_PORT) if self.brokers == 1 else free_port())
        taken = {first}
        nodes = []
        for i in range(self.brokers):
            ports = []
            for _ in range(1 if i == 0 else 2):
                p = free_port()
                while p in taken:
                    p = free_port()
                taken.add(p)
                ports.append(p)
            broker, controller = (first, ports[0]) if i == 0 else (ports[0], ports[1])
            nodes.append(NodeAddress(node_id=i + 1, port=broker, controller_port=controller))
        return nodes

    def start_node(self, node_id: int) -> None:
        """Start one node (formatting its storage on first use) without waiting for it."""
        state = self._require()
        node = next(n for n in state.nodes if n.node_id == node_id)
        home = self.node_dir(node_id)
        home.mkdir(parents=True, exist_ok=True)
        props = home / "server.properties"
        props.write_text(server_properties(node, state.nodes, home / "data"))
        if not (home / "data" / "meta.properties").exists():
            fmt = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", state.cluster_id, "-c", str(props)),
                capture_output=True,
                text=True,
                timeout=300,
            )
            if fmt.returncode != 0:
                detail = (fmt.stderr or fmt.stdout).strip().splitlines()
                raise BrokerError(f"formatting Kafka's storage failed: {detail[-1] if detail else fmt.returncode}")
        with self.log_file(node_id).open("ab") as log:
            proc = subprocess.Popen(
                self._java("kafka.Kafka", str(props)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=home,
                start_new_session=True,  # outlives `tributary kafka up`; not hit by the terminal's Ctrl-C
            )
        self._procs[node_id] = proc
        self._write_state(_State(state.cluster_id, state.nodes, {**state.pids, node_id: proc.pid}))

    def wait_ready(self) -> None:
        """Return once every node answers a metadata request on its own port listing every node:
        waits while the nodes' logs grow, fails at once when a node exits and when they stop growing."""
        state = self._require()
        everyone = {n.node_id for n in state.nodes}
        started = time.monotonic()
        last, moved = -1, started
        pending = list(state.nodes)
        while pending:
            for node in pending:
                if not self.node_alive(node.node_id):
                    raise BrokerError(f"Kafka node {node.node_id} exited while starting: {self._tail(node.node_id)}")
            pending = [n for n in pending if self.live_brokers(f"127.0.0.1:{n.port}", timeout=2.0) != everyone]
            if not pending:
                return
            now = time.monotonic()
            grown = sum(_size(self.log_file(n.node_id)) for n in state.nodes)
            if grown != last:
                last, moved = grown, now
            if now - moved > _STALL_S or now - started > _CEILING_S:
                raise BrokerError(f"Kafka at {self.bootstraps} did not become ready: {self._tail(pending[0].node_id)}")
            time.sleep(0.2)

    def live_brokers(self, bootstraps: str | None = None, *, timeout: float = 5.0) -> set[int]:
        """Node ids of the brokers a metadata request (to `bootstraps`, default every node) lists now;
        empty when none answers."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self._admin_config(bootstraps or self.bootstraps))
        try:
            meta = admin.list_topics(timeout=timeout)
        except Exception:  # KafkaException: nothing answered within timeout
            return set()
        return set(meta.brokers)

    @staticmethod
    def _admin_config(bootstraps: str) -> dict[str, Any]:
        """An admin client's settings for these brokers (log/kafka/clients.py builds them all), quiet."""
        from tributary.log.kafka.clients import admin_config
        from tributary.log.kafka.options import KafkaOptions

        return admin_config(KafkaOptions(bootstrap_servers=bootstraps, client={"log_level": "0"}))

    def leader(self, topic: str, partition: int) -> int:
        """The node that leads `topic`'s `partition` now."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self._admin_config(self.bootstraps))
        meta = admin.list_topics(topic, timeout=30)
        return int(meta.topics[topic].partitions[partition].leader)

    def node_alive(self, node_id: int) -> bool:
        proc = self._procs.get(node_id)
        if proc is not None:
            return proc.poll() is None
        state = self._state()
        pid = None if state is None else state.pids.get(node_id)
        return pid is not None and _pid_alive(pid)

    def kill(self, node_id: int) -> None:
        """kill -9 one node (a crash: nothing flushed, no controlled shutdown)."""
        self._signal(node_id, signal.SIGKILL, wait=30)

    def stop_node(self, node_id: int, *, timeout: float = 120) -> None:
        """Stop one node cleanly (SIGTERM: a controlled shutdown), kill -9 if it does not stop in time."""
        try:
            self._signal(node_id, signal.SIGTERM, wait=timeout)
        except TimeoutError:
            self.kill(node_id)

    def _signal(self, node_id: int, sig: signal.Signals, *, wait: float) -> None:
        state = self._require()
        pid = state.pids.get(node_id)
        if pid is None or not self.node_alive(node_id):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        proc = self._procs.get(node_id)
        deadline = time.monotonic() + wait
        while self.node_alive(node_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka node {node_id} did not stop")
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.2)
            else:
                time.sleep(0.2)
        self._procs.pop(node_id, None)
        pids = {k: v for k, v in self._require().pids.items() if k != node_id}
        self._write_state(_State(state.cluster_id, state.nodes, pids))

    def down(self, *, timeout: float = 60) -> bool:
        """Stop every node at once (its data stays), kill -9 those still running after `timeout`
        (the last nodes of a cluster wait for a quorum that is stopping too); False if none ran."""
        state = self._state()
        if state is None:
            return False
        running = [n.node_id for n in state.nodes if self.node_alive(n.node_id)]
        for node_id in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.pids[node_id], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node_id in running:
            try:
                self._signal(node_id, signal.SIGTERM, wait=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self.kill(node_id)
        return bool(running)

    def is_running(self) -> bool:
        state = self._state()
        return state is not None and all(self.node_alive(n.node_id) for n in state.nodes)

    # -- addresses ----------------------------------------------------------------------
    @property
    def nodes(self) -> list[NodeAddress]:
        return self._require().nodes

    @property
    def bootstraps(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self._require().nodes)

    def _tail(self, node_id: int) -> str:
        lines = []
        with contextlib.suppress(OSError):
            lines = self.log_file(node_id).read_text(errors="replace").strip().splitlines()
        errors = [line for line in lines if " ERROR " in line or "Exception" in line]
        return (errors or lines or [f"no log in {self.log_file(node_id)}"])[-1]


def _cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 characters). Never
    one starting with "-", which `kafka-storage format -t` would take for an option: drawn again,
    as Kafka's own `Uuid.randomUuid` does."""
    import base64

    while True:
        found = base64.urlsafe_b64encode(draw()).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _pid_alive(pid: int) -> bool:
    """The process exists and is no zombie (a killed child not yet reaped by its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
