"""`docker compose config` on deploy/compose.yaml: Compose itself substitutes the variables,
resolves the anchors and merges and checks every reference; the checks below then read the model
Compose resolved (not the YAML as PyYAML sees it, which tests/unit/test_deploy_files.py reads): the
multi-host Spark cluster the projections drive, Kafka's data on a volume, secrets as files, roles
that are not superusers, pulled images pinned by digest, nothing secret in an environment.

Compose needs no Docker engine for `config`: `make compose` (part of `make setup`) builds it into
build/compose. Skipped, with the reason, where neither that build nor a `docker compose` plugin is."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.waiting import run_process

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BUILT = ROOT / "build" / "compose" / "docker-compose"  # `make compose`
PINNED = re.compile(r"^[\w./-]+:\d+(\.\d+)+[\w.-]*@sha256:[0-9a-f]{64}$")  # name:exact-version@digest
SECRET_FILES = ("postgres_password", "service_password", "capture_password", "api_key")  # generate.sh's


def _compose_command() -> list[str] | None:
    """The Compose CLI to run: the one `make compose` built, else an installed `docker compose`
    plugin; None when there is neither."""
    if BUILT.is_file():
        return [str(BUILT)]
    if shutil.which("docker") is not None:
        plugin = run_process(["docker", "compose", "version"], what="docker compose version")
        if plugin.returncode == 0:
            return ["docker", "compose"]
    return None


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    """(the model `docker compose config` resolved, its JSON text, the secrets directory) for a
    copy of deploy/ with the secret files generate.sh makes (never in the checkout)."""
    compose = _compose_command()
    if compose is None:
        pytest.skip("Docker Compose is not built here: `make compose` builds it into build/compose")
    deploy = tmp_path_factory.mktemp("compose") / "deploy"
    shutil.copytree(DEPLOY, deploy, ignore=shutil.ignore_patterns("secrets"))
    (deploy / "secrets").mkdir()
    shutil.copy(DEPLOY / "secrets" / "generate.sh", deploy / "secrets" / "generate.sh")
    made = run_process(["sh", str(deploy / "secrets" / "generate.sh")], what="deploy/secrets/generate.sh")
    assert made.returncode == 0, made.stderr
    # Compose reads COMPOSE_* and the file's own variables from the environment: none from the caller's.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(deploy.parent), "DOCKER_CONFIG": str(deploy.parent)}
    out = run_process(
        [*compose, "-f", str(deploy / "compose.yaml"), "config", "--format", "json"],
        what="docker compose config",
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stdout, deploy / "secrets"


def _command(service: dict[str, Any]) -> list[str]:
    """The service's command; [] where it runs its image's own (Compose writes null)."""
    return list(service.get("command") or [])


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """target → named volume, for the service's volume mounts."""
    return {v["target"]: v["source"] for v in service.get("volumes", []) if v["type"] == "volume"}


def _secret_text(model: dict[str, Any], service: dict[str, Any], path: str) -> str:
    """The text of the secret file a service sees at `path` (it must mount one there)."""
    sources = {s["target"]: s["source"] for s in service.get("secrets", [])}
    assert path in sources, f"nothing mounted at {path}"
    return Path(model["secrets"][sources[path]]["file"]).read_text().strip()


def test_projections_drive_a_spark_cluster_of_several_hosts(resolved: tuple[dict[str, Any], str, Path]) -> None:
    model, _, _ = resolved
    services = model["services"]
    master = services["spark-master"]["command"]
    assert master[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    url = f"spark://{_option(master, '--host')}:{_option(master, '--port')}"
    assert _option(master, "--host") == services["spark-master"]["hostname"]
    projections = services["projections"]
    env = projections["environment"]
    assert env["TRIBUTARY_PROJECTIONS__SPARK_MASTER"] == url
    conf = json.loads(env["TRIBUTARY_PROJECTIONS__SPARK_CONF"])
    assert conf["spark.driver.host"] == projections["hostname"]  # the executors connect back to it
    # the executors COPY into the service database themselves: its DSN as they reach it
    executor_dsn = _secret_text(model, projections, env["TRIBUTARY_PROJECTIONS__EXECUTOR_DSN_FILE"])
    assert urlsplit(executor_dsn).hostname == "postgres"
    log_root = env["TRIBUTARY_LOG__ROOT"]
    workers = {n: s for n, s in services.items() if _command(s)[1:2] == ["org.apache.spark.deploy.worker.Worker"]}
    assert len(workers) >= 2, sorted(workers)
    hosts, cores = set(), 0
    for name, worker in workers.items():
        command = worker["command"]
        assert command[2] == url, name
        assert _option(command, "--host") == worker["hostname"] == name, name  # a host of its own
        hosts.add(worker["hostname"])
        cores += int(_option(command, "--cores"))
        assert _mounts(worker).get(log_root) == "log", name  # the log at the driver's path
        assert name in projections["depends_on"], name
        assert not worker.get("secrets"), name  # a worker holds no secret
    assert len(hosts) == len(workers)
    assert _mounts(projections).get(log_root) == "log"
    assert int(conf["spark.cores.max"]) == cores  # the first pass waits for every worker's cores


def test_kafka_keeps_its_data_on_a_named_volume(resolved: tuple[dict[str, Any], str, Path]) -> None:
    model, _, _ = resolved
    kafka = model["services"]["kafka"]
    data = kafka["environment"]["KAFKA_LOG_DIRS"]
    assert _mounts(kafka).get(data) == "kafka"
    assert "kafka" in model["volumes"]
    tributary = [s for s in model["services"].values() if _command(s)[:1] == ["tributary"]]
    assert tributary and all(
        json.loads(s["environment"]["TRIBUTARY_LOG__KAFKA"])["bootstrap_servers"] == "kafka:9092" for s in tributary
    )


def test_secrets_are_files_and_the_dsns_use_roles_that_are_not_superusers(
    resolved: tuple[dict[str, Any], str, Path],
) -> None:
    model, _, secrets = resolved
    for name, secret in model["secrets"].items():
        assert Path(secret["file"]).parent == secrets and Path(secret["file"]).is_file(), name
    users: dict[str, set[str]] = {}
    for name, service in model["services"].items():
        for key, value in service.get("environment", {}).items():
            if key.endswith("_FILE"):  # each file a service is told of is a secret it mounts
                assert value.startswith("/run/secrets/"), (name, key)
                text = _secret_text(model, service, value)
                for dsn in re.findall(r"postgresql://[^\s\"]+", text):
                    users.setdefault(name, set()).add(urlsplit(dsn).username or "")
    tributary = {n for n, s in model["services"].items() if _command(s)[:1] == ["tributary"]}
    assert set(users) == tributary, users
    assert set().union(*users.values()) == {"tributary_service", "tributary_capture"}, users
    postgres = model["services"]["postgres"]
    assert postgres["environment"] == {"POSTGRES_PASSWORD_FILE": "/run/secrets/postgres_password"}
    assert {s["source"] for s in postgres["secrets"]} == {"postgres_password", "service_password", "capture_password"}


def test_no_secret_is_in_the_resolved_model(resolved: tuple[dict[str, Any], str, Path]) -> None:
    model, text, secrets = resolved
    for name in SECRET_FILES:
        value = (secrets / name).read_text().strip()
        assert len(value) >= 32 and value not in text, name
    for name, service in model["services"].items():
        for key, value in service.get("environment", {}).items():
            assert "postgresql://" not in str(value), f"{name}: {key} holds a DSN"
            if re.search(r"PASSWORD|DSN|KEYS?$|SECRET|TOKEN", key.removesuffix("_FILE")):
                assert key.endswith("_FILE"), f"{name}: {key} in plain text"


def test_pulled_images_are_pinned_by_digest_and_built_ones_by_version(
    resolved: tuple[dict[str, Any], str, Path],
) -> None:
    model, _, _ = resolved
    pulled = 0
    for name, service in model["services"].items():
        image = service["image"]
        if "build" in service:
            assert re.fullmatch(r"[\w./-]+:\d+(\.\d+)+[\w.-]*", image), f"{name}: {image}"
        else:
            assert PINNED.match(image), f"{name}: {image} is not pinned by exact version and digest"
            pulled += 1
    assert pulled >= 1  # Kafka's image at least
