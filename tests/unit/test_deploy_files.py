"""deploy/: compose and systemd files name real commands and real configuration keys, and the
compose file's parts fit together (databases, Kafka, the Spark master, the driver's address).

No Docker engine runs on the build machines: the compose file is checked by structure here, and by
`docker compose config` where an engine answers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from tributary.api.cli.main import app
from tributary.api.settings.config import LogSettings, Settings, load_settings

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# The Kafka log backend's keys (`[log] backend`, `[log.kafka]`): compose.yaml runs capture on it.
# They are settings once that backend is part of the build; until then they are the only names
# compose may use that `Settings` does not know yet.
KAFKA_KEYS = {"TRIBUTARY_LOG__BACKEND", "TRIBUTARY_LOG__KAFKA"}
KAFKA_BACKEND_BUILT = "backend" in LogSettings.model_fields
API_KEY = "k" * 32  # what compose substitutes for ${TRIBUTARY_API_KEY:?…}


def _is_config_key(env: str) -> bool:
    """TRIBUTARY_<SECTION>__<KEY> (or a top-level TRIBUTARY_<KEY>) names a settings field."""
    name = env.removeprefix("TRIBUTARY_").lower()
    section, _, key = name.partition("__")
    fields = Settings.model_fields
    if not key:
        return section in fields
    if section not in fields:
        return False
    model = fields[section].annotation
    sub = getattr(model, "model_fields", {})
    return key in sub or any(f.alias == key for f in sub.values())


def _cli_accepts(argv: list[str]) -> bool:
    words = []
    for w in argv[1:]:
        if w.startswith("-"):
            break  # options (and their values) follow the command words
        words.append(w)
    path = words[:2] if words[:1] in (["log"], ["pg"], ["project"], ["capture"]) and len(words) > 1 else words[:1]
    return CliRunner().invoke(app, [*path, "--help"]).exit_code == 0


def test_compose_services_use_real_commands_and_keys() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "capture", "api", "projections", "spark-master", "spark-worker-1", "spark-worker-2"} <= set(
        services
    )
    commands, keys = set(), set()
    for name, service in services.items():
        command = service.get("command")
        if command and command[0] == "tributary":
            assert _cli_accepts(command), f"{name}: {command} is not a tributary command"
            commands.add(name)
        for env in service.get("environment", {}):
            if env.startswith("TRIBUTARY_"):
                if env in KAFKA_KEYS and not KAFKA_BACKEND_BUILT:
                    keys.add(env)
                    continue
                assert _is_config_key(env.removesuffix("_FILE")), f"{name}: {env} is not a configuration key"
                keys.add(env)
    # the loops above checked something: every tributary service, and the settings they share
    assert commands == {"init", "capture", "api", "projections"}, commands
    assert {"TRIBUTARY_SERVICE__DSN_FILE", "TRIBUTARY_LOG__ROOT", "TRIBUTARY_SOURCES_FILE", *KAFKA_KEYS} <= keys, keys
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["api"]


def test_systemd_units_run_real_commands() -> None:
    units = sorted(DEPLOY.glob("systemd/*.service"))
    assert [u.name for u in units] == [  # a missing or renamed unit fails here, not silently
        "tributary-api.service",
        "tributary-capture.service",
        "tributary-projections@.service",
    ]
    for unit in units:
        exec_start = re.search(r"^ExecStart=(\S+) (.*)$", unit.read_text(), re.M)
        assert exec_start, unit.name
        argv = ["tributary", *exec_start.group(2).replace("%i", "account_balances").split()]
        assert _cli_accepts(argv), f"{unit.name}: {argv}"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def _substituted(value: str) -> str:
    """`${NAME:?message}` / `${NAME:-default}` as compose substitutes them for this test."""
    return re.sub(r"\$\{TRIBUTARY_API_KEY:\?[^}]*\}", API_KEY, value)


def _secrets(tmp_path: Path) -> Path:
    """deploy/secrets/generate.sh run on a copy: the files compose mounts under /run/secrets."""
    out = tmp_path / "secrets"
    if not out.exists():
        out.mkdir()
        shutil.copy(DEPLOY / "secrets" / "generate.sh", out / "generate.sh")
        subprocess.run(["sh", str(out / "generate.sh")], check=True, capture_output=True)
    return out


def _mounted(service: dict[str, Any], value: str, tmp_path: Path) -> str:
    """A `/run/secrets/<name>` path as this test sees it: the generated file compose mounts there,
    which the service must list in its `secrets`."""
    if not value.startswith("/run/secrets/"):
        return value
    name = value.removeprefix("/run/secrets/")
    assert name in service.get("secrets", []), f"{value}: the service does not mount secret {name!r}"
    source = _compose()["secrets"][name]["file"]
    return str(_secrets(tmp_path) / Path(source).name)


def _settings_of(service: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    """The settings a service's process loads: its environment (secrets from their files), no file."""
    for name in list(os.environ):
        if name.upper().startswith("TRIBUTARY_"):
            monkeypatch.delenv(name)
    for name, value in service.get("environment", {}).items():
        if name in KAFKA_KEYS and not KAFKA_BACKEND_BUILT:
            continue
        monkeypatch.setenv(name, _mounted(service, _substituted(str(value)), tmp_path))
    monkeypatch.chdir(tmp_path)  # no tributary.toml here
    return load_settings()


def _tributary_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in _compose()["services"].items() if (s.get("command") or [""])[0] == "tributary"}


def test_every_tributary_service_loads_its_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    services = _tributary_services()
    assert set(services) == {"init", "capture", "api", "projections"}
    for name, service in services.items():
        settings = _settings_of(service, monkeypatch, tmp_path)  # ConfigError (one line per mistake) fails here
        assert settings.service.dsn, name
        assert [s.name for s in settings.sources] == ["shop"], name
        assert "tributary.projections.examples.account_balances" in settings.projections.modules, name
    api = _settings_of(services["api"], monkeypatch, tmp_path)
    key = (_secrets(tmp_path) / "api_key").read_text().strip()
    assert [k.key for k in api.api.keys] == [key]  # binding 0.0.0.0 needs a key


def _init_sql() -> str:
    return (DEPLOY / "postgres" / "init.sql").read_text()


def test_the_init_script_creates_the_databases_the_config_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sql = _init_sql()
    created = set(re.findall(r"^CREATE DATABASE (\w+)[ ;]", sql, re.M))
    settings = _settings_of(_tributary_services()["capture"], monkeypatch, tmp_path)
    named = {urlsplit(settings.service.dsn or "").path.lstrip("/")} | {
        urlsplit(s.dsn).path.lstrip("/") for s in settings.sources
    }
    assert named == {"tributary", "shop"}
    assert named <= created, (named, created)
    # the source's tables: created in `shop`, each with a primary key (`init` refuses tables
    # without one), with a few rows
    shop = sql.split("\\connect shop", 1)[1]
    tables = re.findall(r"CREATE TABLE (\w+) \((.*?)\n\);", shop, re.S)
    assert {t for t, _ in tables} >= {"orders"}, tables
    assert all("PRIMARY KEY" in body for _, body in tables), tables
    for table, _ in tables:
        rows = re.search(rf"INSERT INTO {table} \([^)]*\) VALUES(.*?);", shop, re.S)
        assert rows and rows.group(1).count("(") >= 3, table


def test_postgres_image_has_wal2json_logical_decoding_and_the_init_script() -> None:
    postgres = _compose()["services"]["postgres"]
    dockerfile = (DEPLOY / postgres["build"]["context"] / "Dockerfile").read_text()
    assert re.search(r"apt-get install .*postgresql-\$\{PG_MAJOR\}-wal2json", dockerfile)
    copied = re.search(r"^COPY (\S+) /docker-entrypoint-initdb.d/", dockerfile, re.M)
    assert copied and (DEPLOY / postgres["build"]["context"] / copied.group(1)).is_file()
    assert "wal_level=logical" in postgres["command"]
    # ready over TCP: during the init script the server answers on its Unix socket only
    assert postgres["healthcheck"]["test"][1:4] == ["pg_isready", "-h", "127.0.0.1"]


def test_kafka_runs_in_kraft_mode_where_capture_looks_for_it() -> None:
    services = _compose()["services"]
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    pom = (DEPLOY / "kafka" / "pom.xml").read_text()
    tested = pom.split("<kafka.version>", 1)[1].split("</kafka.version>", 1)[0]
    assert kafka["image"].startswith(f"apache/kafka:{tested}@sha256:")  # the broker the tests run, pinned
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}  # KRaft, one node
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    advertised = env["KAFKA_ADVERTISED_LISTENERS"].removeprefix("PLAINTEXT://")
    for name, service in _tributary_services().items():
        log_kafka = yaml.safe_load(service["environment"]["TRIBUTARY_LOG__KAFKA"])  # JSON is YAML
        assert service["environment"]["TRIBUTARY_LOG__BACKEND"] == "kafka", name
        assert log_kafka["bootstrap_servers"] == advertised, name
        assert log_kafka["replication_factor"] == 1, name  # one broker
    # capture starts after init, which waits for a broker that answers
    assert services["init"]["depends_on"]["kafka"] == {"condition": "service_healthy"}
    assert services["capture"]["depends_on"]["init"] == {"condition": "service_completed_successfully"}


def _workers() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in _compose()["services"].items() if n.startswith("spark-worker")}


def test_projections_drive_the_spark_master_and_the_workers_reach_the_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    services = _compose()["services"]
    master_cmd = services["spark-master"]["command"]
    assert master_cmd[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    host = master_cmd[master_cmd.index("--host") + 1]
    port = master_cmd[master_cmd.index("--port") + 1]
    settings = _settings_of(services["projections"], monkeypatch, tmp_path)
    assert settings.projections.spark_master == f"spark://{host}:{port}"
    conf = settings.projections.spark_conf
    assert conf["spark.driver.host"] == services["projections"]["hostname"] == "projections"
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"
    assert f"log:{settings.log.root}" in services["projections"]["volumes"]
    workers = _workers()
    assert len(workers) >= 2, workers  # the multi-host example: executors on several hosts
    cores = 0
    for name, worker in workers.items():
        cmd = worker["command"]
        assert cmd[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"], name
        assert host == "spark-master" and cmd[2] == f"spark://{host}:{port}", name
        assert cmd[cmd.index("--host") + 1] == worker["hostname"] == name  # its own host, not loopback
        cores += int(cmd[cmd.index("--cores") + 1])
        # executors read the log root at the driver's path (the check before a run insists)
        assert f"log:{settings.log.root}" in worker["volumes"], name
        assert worker["depends_on"]["spark-master"] == {"condition": "service_started"}, name
        assert name in services["projections"]["depends_on"], name
    assert int(conf["spark.cores.max"]) == cores  # the first pass waits for every worker's cores


def _from_lines(dockerfile: str) -> list[tuple[str, str | None]]:
    """(image, stage name) of each FROM, with the file's ARG defaults substituted."""
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, re.M))
    out = []
    for image, stage in re.findall(r"^FROM (\S+)(?: AS (\w+))?$", dockerfile, re.M):
        out.append((re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image), stage or None))
    return out


PINNED = re.compile(r"^[\w./-]+:\d+(\.\d+)+[\w.-]*@sha256:[0-9a-f]{64}$")  # name:exact-version@digest


def test_the_image_builds_in_two_stages_from_pinned_bases() -> None:
    """Docker's engine does not run on the build machines: the Dockerfile is checked by structure."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    froms = _from_lines(dockerfile)
    assert [stage for _, stage in froms] == ["build", "runtime"]
    for image, stage in froms:
        assert PINNED.match(image), f"{stage}: {image} is not pinned by exact version and digest"
    build, runtime = dockerfile.split("\nFROM ", 2)[1:]
    # the Cython extensions need a C compiler in the build stage, and only there
    assert re.search(r"apt-get install [^\n]*\bgcc\b", build) and "gcc" not in runtime
    assert "--require-hashes -r deploy/build-requirements.lock" in build and "--no-build-isolation" in build
    assert re.search(r"pip wheel .*--wheel-dir /wheels \./client \.$", build, re.M)
    assert "COPY --from=build /wheels" in runtime and "--no-index /tmp/wheels/*.whl" in runtime
    assert "--require-hashes -r /tmp/requirements.lock" in runtime
    users = re.findall(r"^USER (\S+)$", runtime, re.M)
    assert users and users[-1] not in ("root", "0")
    postgres = _from_lines((DEPLOY / "postgres" / "Dockerfile").read_text())
    assert all(PINNED.match(image) for image, _ in postgres), postgres
    for name, service in _compose()["services"].items():
        image = service.get("image", "")
        assert not image.endswith(":latest") and ":latest}" not in image, name
        if "build" not in service:  # pulled as it is: pinned like the bases
            assert PINNED.match(image), f"{name}: {image}"


def _locked(path: Path) -> dict[str, str]:
    """name → version of a lock file; every requirement pinned with `==` and carrying hashes."""
    text = path.read_text()
    entries = re.findall(r"^([A-Za-z0-9._-]+)==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text, re.M)
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith(("#", " "))]
    assert len(entries) == len(lines), f"{path.name}: every requirement `==` with hashes"
    return {re.sub(r"[-_.]+", "-", n).lower(): v for n, v, _ in entries}


def test_the_lock_files_pin_every_dependency_with_hashes() -> None:
    import tomllib

    from packaging.requirements import Requirement

    locked = _locked(DEPLOY / "requirements.lock")
    root = DEPLOY.parent
    wanted = [
        *tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"],
        *tomllib.loads((root / "client" / "pyproject.toml").read_text())["project"]["dependencies"],
    ]
    for line in wanted:
        req = Requirement(line)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name == "tributary-client":
            continue  # built from client/ in the build stage
        assert name in locked, f"{name} is not in deploy/requirements.lock"
        assert req.specifier.contains(locked[name], prereleases=True), (name, locked[name], str(req.specifier))
    build = _locked(DEPLOY / "build-requirements.lock")
    system = tomllib.loads((root / "pyproject.toml").read_text())["build-system"]["requires"]
    for line in system:
        req = Requirement(line)
        assert req.specifier.contains(build[req.name.lower()]), (req.name, build)


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    ignored = {ln.strip() for ln in (DEPLOY.parent / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".git", ".tributary", "build", "deploy/secrets"} <= ignored, ignored
    assert not {"deploy", "deploy/requirements.lock", "client", "capture"} & ignored


def test_secrets_are_files_and_no_dsn_is_a_superusers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    compose = _compose()
    declared = compose["secrets"]
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            text = str(value).lower()
            assert "password" not in key.lower() or key.endswith("_FILE"), f"{name}: {key} in plain text"
            assert "postgresql://" not in text and "postgres:postgres" not in text, f"{name}: {key} holds a DSN"
        assert set(service.get("secrets", [])) <= set(declared), name
    secrets = _secrets(tmp_path)
    for name, spec in declared.items():  # generate.sh makes every file compose mounts
        assert (secrets / Path(spec["file"]).name).is_file(), name
    assert (DEPLOY / "secrets" / ".gitignore").read_text().splitlines()[1:] == ["*", "!.gitignore", "!generate.sh"]
    postgres = compose["services"]["postgres"]
    assert postgres["environment"] == {"POSTGRES_PASSWORD_FILE": "/run/secrets/postgres_password"}
    # tributary connects as the roles init.sql makes, never as the superuser
    sql = _init_sql()
    roles = dict(re.findall(r"^CREATE ROLE (\w+) ([A-Z ]+) PASSWORD", sql, re.M))
    assert roles == {"tributary_service": "LOGIN REPLICATION", "tributary_capture": "LOGIN REPLICATION"}, roles
    for name in ("service_password", "capture_password"):
        assert f"`cat /run/secrets/{name}`" in sql and name in postgres["secrets"]
    settings = _settings_of(_tributary_services()["capture"], monkeypatch, tmp_path)
    assert urlsplit(settings.service.dsn or "").username == "tributary_service"
    assert [urlsplit(s.dsn).username for s in settings.sources] == ["tributary_capture"]


def test_kafka_keeps_its_data_on_a_volume() -> None:
    compose = _compose()
    kafka = compose["services"]["kafka"]
    data = kafka["environment"]["KAFKA_LOG_DIRS"]
    assert f"kafka:{data}" in kafka["volumes"] and "kafka" in compose["volumes"]
