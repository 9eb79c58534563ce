"""A Spark standalone cluster on this machine that behaves like several hosts.

The master and one worker listen on the host end of a veth pair; a second worker runs in a network
namespace of its own (the other end of the pair), so the driver and its executors talk over a real
non-loopback link, and in a mount namespace where `hidden` is an empty tmpfs: a directory the
driver has and that worker lacks (the projection files, which the job must ship). Postgres listens
on loopback only: executors reach it through `Forwarder`, as they would through a service address.
Everything is started from pyspark's own `spark-class` and torn down by `close`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.waiting import size_of, wait_progress

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
# The master's page is on the veth address: never through an HTTP proxy the environment names (a CI
# machine's proxy answered for 10.231.x.1 with a page of its own).
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@dataclass
class Cluster:
    """Master + worker on `host_ip`, a worker at `ns_ip` in namespace `netns`."""

    base: Path
    hidden: Path
    netns: str
    veth: str
    host_ip: str
    ns_ip: str
    port: int
    ui_port: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def master(self) -> str:
        return f"spark://{self.host_ip}:{self.port}"

    def env(self, ip: str) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": ip,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.base / "logs"),
        }

    def start_network(self) -> None:
        """The namespace and the veth pair between it and this host, both ends up."""
        _sh("ip", "netns", "add", self.netns)
        _sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", self.veth + "p")
        _sh("ip", "link", "set", self.veth + "p", "netns", self.netns)
        _sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.veth)
        _sh("ip", "link", "set", self.veth, "up")
        _sh("ip", "netns", "exec", self.netns, "ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.veth + "p")
        _sh("ip", "netns", "exec", self.netns, "ip", "link", "set", self.veth + "p", "up")
        _sh("ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up")

    def start(self) -> None:
        """The master, then both workers; returns once the master lists both alive."""
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        master = ["org.apache.spark.deploy.master.Master", "--host", self.host_ip, "--port", str(self.port)]
        self._spawn("master", [str(SPARK_CLASS), *master, "--webui-port", str(self.ui_port)], self.host_ip)
        self.start_worker("worker-host")
        self.start_worker("worker-ns")
        self.wait_workers(2)

    def start_worker(self, name: str) -> None:
        ip = self.ns_ip if name == "worker-ns" else self.host_ip
        work = self.base / "work" / name
        work.mkdir(parents=True, exist_ok=True)
        worker = [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", self.master, "--host", ip]
        worker += ["--cores", "1", "--memory", "1g", "--webui-port", "0", "--work-dir", str(work)]
        if name == "worker-ns":  # its own network, and `hidden` an empty directory there
            script = 'mount -t tmpfs tmpfs "$1" && shift && exec "$@"'
            worker = [
                "ip",
                "netns",
                "exec",
                self.netns,
                "unshare",
                "-m",
                "sh",
                "-c",
                script,
                "sh",
                str(self.hidden),
                *worker,
            ]
        self._spawn(name, worker, ip)

    def _spawn(self, name: str, cmd: list[str], ip: str) -> None:
        with (self.base / "logs" / f"{name}.out").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(ip),
                start_new_session=True,
            )

    def alive_workers(self) -> list[str]:
        """The hosts of the workers the master lists as alive (its JSON page)."""
        try:
            with _DIRECT.open(f"http://{self.host_ip}:{self.ui_port}/json/", timeout=5) as r:
                page = json.load(r)
        except OSError:
            return []
        return sorted(w["host"] for w in page.get("workers", []) if w.get("state") == "ALIVE")

    def wait_workers(self, n: int) -> None:
        wait_progress(
            lambda: len(self.alive_workers()) >= n,
            lambda: size_of(self.base / "logs"),
            what=f"{n} Spark workers to register with {self.master}",
        )

    def kill_ns_worker(self) -> None:
        """kill -9 every process of the namespaced host: its worker, executor and Python workers."""
        pids = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        self.procs["worker-ns"].wait()

    def close(self) -> None:
        for name in ("worker-ns", "worker-host", "master"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if self.netns:
            for pid in subprocess.run(
                ["ip", "netns", "pids", self.netns], capture_output=True, text=True
            ).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


class Forwarder:
    """A TCP port on `listen_ip` relaying every connection to `target` (Postgres on loopback)."""

    def __init__(self, listen_ip: str, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.create_server((listen_ip, 0))
        self.port = int(self.sock.getsockname()[1])
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self.closed = True
        self.sock.close()
