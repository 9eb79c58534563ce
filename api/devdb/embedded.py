"""The embedded PostgreSQL cluster behind `tributary pg up|down|dsn`, the demo and the tests.

A real PostgreSQL 15+ (Debian's binaries) with wal2json, `wal_level=logical` and trust auth on
loopback only. PostgreSQL refuses to run as root, so under root the cluster belongs to the
`postgres` OS user (created by Debian's package; we create `tributary` when it is missing).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EmbeddedPostgres", "PgError", "find_bin_dir", "free_port", "listening_socket"]

DATABASE = "tributary"
SUPERUSER = "postgres"
PREFERRED_PORT = 5433
_STATE = "tributary-pg.json"


class PgError(Exception):
    """The embedded cluster cannot be set up or started; the message says what to do."""


def find_bin_dir() -> Path:
    """Newest PostgreSQL >= 15 server binaries: Debian's /usr/lib/postgresql/N/bin, else PATH."""
    candidates = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "postgres").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for path in candidates:
        if path.parent.name.isdigit() and int(path.parent.name) >= 15:
            return path
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    raise PgError(
        "PostgreSQL server binaries not found: install them with `apt-get install postgresql-15 postgresql-15-wal2json`"
    )


def listening_socket(preferred: int = 0) -> socket.socket:
    """A TCP socket listening on 127.0.0.1: on `preferred` if it is free, else on any free port.
    Held by the caller until its server takes it over, so no other process can take the port
    between choosing it and serving on it (as a port number chosen by `free_port` can be)."""
    for port in (preferred, 0):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen(128)
        except OSError:
            s.close()
            continue
        return s
    raise PgError("no free TCP port on 127.0.0.1")


def free_port(preferred: int = 0) -> int:
    """`preferred` if it is free on 127.0.0.1, else any free port (free when this returns; a server
    that must not lose it to another process takes `listening_socket` instead)."""
    with listening_socket(preferred) as s:
        return int(s.getsockname()[1])


def _os_user() -> str | None:
    """The OS user that owns the cluster; None = the current (non-root) user."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "tributary"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "tributary"],
        check=True,
        capture_output=True,
    )
    return "tributary"


@dataclass(frozen=True, slots=True)
class _State:
    port: int
    pgdata: str


class EmbeddedPostgres:
    """One cluster under `data_dir` (default `.tributary/pg`)."""

    def __init__(self, data_dir: Path, *, bin_dir: Path | None = None) -> None:
        self.data_dir = data_dir.absolute()
        self._bin_dir = bin_dir
        self._user = _os_user()

    # -- paths -----------------------------------------------------------------
    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_bin_dir()
        return self._bin_dir

    def _state(self) -> _State | None:
        path = self.data_dir / _STATE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return _State(port=int(raw["port"]), pgdata=str(raw["pgdata"]))

    def _write_state(self, state: _State) -> None:
        tmp = self.data_dir / (_STATE + ".tmp")
        tmp.write_text(json.dumps({"port": state.port, "pgdata": state.pgdata}) + "\n")
        os.replace(tmp, self.data_dir / _STATE)

    def _pgdata_location(self) -> Path:
        """Where PGDATA lives: inside data_dir if the cluster's OS user can reach it."""
        inside = self.data_dir / "data"
        if self._user is None or self._user_can_reach(self.data_dir):
            return inside
        # e.g. a checkout under /root (mode 700): keep the cluster where its owner can reach it.
        digest = abs(hash_path(self.data_dir))
        return Path(f"/var/tmp/tributary-pg-{digest:x}")

    def _user_can_reach(self, path: Path) -> bool:
        probe = subprocess.run(
            ["runuser", "-u", str(self._user), "--", "test", "-x", str(path)],
            capture_output=True,
        )
        return probe.returncode == 0

    # -- running commands ----------------------------------------------------------
    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise PgError(f"{Path(args[0]).name} failed: {detail[-1] if detail else proc.returncode}")
        return proc

    def _pg_ctl(self, pgdata: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(str(self.bin_dir / "pg_ctl"), "-D", str(pgdata), *args, check=check)

    # -- checks ------------------------------------------------------------------
    def check_wal2json(self) -> None:
        # pg_config only reads: run it as ourselves (the cluster's user may not reach bin_dir).
        out = subprocess.run(
            [str(self.bin_dir / "pg_config"), "--pkglibdir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if not (Path(out) / "wal2json.so").exists():
            version = self.bin_dir.parent.name
            raise PgError(f"wal2json is not installed in {out}: run `apt-get install postgresql-{version}-wal2json`")

    def _has_output_plugin_allowlist(self) -> bool:
        proc = subprocess.run([str(self.bin_dir / "postgres"), "--describe-config"], capture_output=True, text=True)
        return any(line.startswith("output_plugin_libraries\t") for line in proc.stdout.splitlines())

    # -- lifecycle ---------------------------------------------------------------
    def is_running(self) -> bool:
        state = self._state()
        if state is None or not Path(state.pgdata, "PG_VERSION").exists():
            return False
        return self._pg_ctl(Path(state.pgdata), "status", check=False).returncode == 0

    def up(self, *, port: int | None = None) -> str:
        """Initialise if needed, start if stopped, create the `tributary` database; return its DSN."""
        self.check_wal2json()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        state = self._state()
        if state is not None and self.is_running():
            if port is not None and port != state.port:
                raise PgError(f"the embedded cluster already runs on port {state.port}, not {port}")
            self._ensure_database(state.port)
            return self.dsn()
        pgdata = Path(state.pgdata) if state else self._pgdata_location()
        if not (pgdata / "PG_VERSION").exists():
            self._initdb(pgdata)
        chosen = port or (state.port if state and _port_free(state.port) else None) or free_port(PREFERRED_PORT)
        for attempt in range(3):
            self._write_state(_State(port=chosen, pgdata=str(pgdata)))
            try:
                self._start(pgdata, chosen)
                break
            except PgError:
                # Another process took the port between choosing it and the server binding it
                # (clusters started side by side): a port of its own, unless the user named one.
                if port is not None or attempt == 2 or _port_free(chosen):
                    raise
                chosen = free_port()
        self._ensure_database(chosen)
        return self.dsn()

    def _initdb(self, pgdata: Path) -> None:
        pgdata.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            shutil.chown(pgdata, user=self._user)
            shutil.chown(self.data_dir, user=self._user)
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(pgdata),
            "-U",
            SUPERUSER,
            "-A",
            "trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
            "--no-instructions",
        )
        conf = pgdata / "postgresql.conf"
        with conf.open("a") as fh:
            fh.write(
                "\n# --- tributary embedded defaults ---\n"
                "wal_level = logical\n"
                "max_replication_slots = 32\n"
                "max_wal_senders = 32\n"
                "listen_addresses = '127.0.0.1'\n"
                "unix_socket_directories = ''\n"
                "timezone = 'UTC'\n"
                "log_timezone = 'UTC'\n"
                "max_connections = 200\n"
                "shared_buffers = '256MB'\n"
                "wal_sender_timeout = '60s'\n"
                "logging_collector = off\n"
            )
            if self._has_output_plugin_allowlist():
                # Debian's 15.18 build only lets allow-listed libraries be output plugins.
                fh.write("output_plugin_libraries = 'pgoutput, test_decoding, wal2json'\n")

    def _start(self, pgdata: Path, port: int) -> None:
        logfile = self.log_file
        proc = self._pg_ctl(pgdata, "-w", "-t", "60", "-l", str(logfile), "-o", f"-p {port}", "start", check=False)
        if proc.returncode != 0:
            tail = ""
            with contextlib.suppress(OSError, IndexError):
                lines = logfile.read_text().strip().splitlines()
                # The reason (`FATAL:  could not create any TCP/IP sockets`…), not the shutdown after it.
                tail = next((line for line in reversed(lines) if "FATAL" in line or "ERROR" in line), lines[-1])
            raise PgError(f"PostgreSQL did not start on 127.0.0.1:{port}: {tail or proc.stderr.strip()}")

    def _ensure_database(self, port: int) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self._dsn(port, "postgres"), autocommit=True, connect_timeout=5) as conn:
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{DATABASE}"')
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise PgError(f"cannot connect to the embedded cluster on port {port}: {exc}") from None
                time.sleep(0.2)

    def down(self) -> bool:
        """Stop the cluster; False if it was not running."""
        state = self._state()
        if state is None or not self.is_running():
            return False
        self._pg_ctl(Path(state.pgdata), "-w", "-t", "60", "-m", "fast", "stop")
        return True

    def restart(self) -> None:
        state = self._state()
        if state is None:
            raise PgError(f"no embedded cluster in {self.data_dir}")
        # stop + start rather than `pg_ctl restart`: restart would hand the server our stdout pipe.
        self._pg_ctl(Path(state.pgdata), "-w", "-t", "60", "-m", "fast", "stop", check=False)
        self._start(Path(state.pgdata), state.port)

    def destroy(self) -> None:
        """Stop and delete the cluster's files (tests)."""
        state = self._state()
        self.down()
        if state is not None:
            shutil.rmtree(state.pgdata, ignore_errors=True)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- addresses -------------------------------------------------------------------
    @property
    def port(self) -> int:
        state = self._state()
        if state is None:
            raise PgError(f"no embedded cluster in {self.data_dir}: run `tributary pg up`")
        return state.port

    @property
    def pgdata(self) -> Path:
        state = self._state()
        if state is None:
            raise PgError(f"no embedded cluster in {self.data_dir}: run `tributary pg up`")
        return Path(state.pgdata)

    @property
    def log_file(self) -> Path:
        pgdata = self.pgdata
        return pgdata.parent / "postgres.log" if pgdata.parent == self.data_dir else pgdata / "postgres.log"

    def dsn(self, dbname: str = DATABASE) -> str:
        return self._dsn(self.port, dbname)

    @staticmethod
    def _dsn(port: int, dbname: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{dbname}"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def hash_path(path: Path) -> int:
    """Stable (unsalted) hash of a path, for naming directories."""
    import zlib

    return zlib.crc32(str(path).encode())
