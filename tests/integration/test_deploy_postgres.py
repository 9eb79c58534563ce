"""deploy/postgres/init.sql on a real PostgreSQL: it makes two roles that are not superusers, and
with them alone `tributary init` sets up the service database and the source (replication slot,
snapshot reads), while the capture role can change nothing in the source.

The script runs as compose's image runs it (psql as the superuser), with the secret files
`deploy/secrets/generate.sh` makes (in a temporary directory) and its databases and roles renamed so
that it can run on the test server; `tributary init` then runs as compose's `init` service runs it:
its command and environment, the DSNs read from those secret files (`*_FILE`), the log local (no
broker here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import yaml

from tests.pg import REPO_ROOT, PgServer
from tests.waiting import run_process
from tributary.api.devdb.embedded import find_bin_dir

pytestmark = pytest.mark.integration

INIT_SQL = REPO_ROOT / "deploy" / "postgres" / "init.sql"
NAMES = ("tributary_service", "tributary_capture", "tributary", "shop")  # roles, then databases


def _renamed(text: str, suffix: str, secrets: Path) -> str:
    text = text.replace("/run/secrets/", f"{secrets}/")
    for name in NAMES:
        text = re.sub(rf"(?<![\w/.]){name}(?![\w.])", f"{name}_{suffix}", text)
    return text


def test_init_sql_roles_are_enough_for_tributary_init(pg_server: PgServer, tmp_path: Path) -> None:
    if pg_server.embedded is None:
        pytest.skip("runs psql from the embedded server's binaries")
    suffix = uuid.uuid4().hex[:8]
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    shutil.copy(REPO_ROOT / "deploy" / "secrets" / "generate.sh", secrets)
    made = run_process(["sh", str(secrets / "generate.sh")], what="generate.sh")
    assert made.returncode == 0, made.stderr
    script = tmp_path / "init.sql"
    script.write_text(_renamed(INIT_SQL.read_text(), suffix, secrets))
    psql = [str(find_bin_dir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script)]
    out = run_process([*psql, pg_server.dsn("postgres")], what="psql -f init.sql")
    assert out.returncode == 0, out.stderr
    service, capture, service_db, shop = (f"{n}_{suffix}" for n in NAMES)
    with pg_server.admin() as conn:
        roles = conn.execute(
            "SELECT rolname, rolsuper, rolreplication, rolcreatedb, rolcreaterole FROM pg_roles "
            "WHERE rolname = ANY(%s) ORDER BY rolname",
            ([service, capture],),
        ).fetchall()
    # both replicate: capture follows the source, and the event store's table in the service database
    assert roles == [(capture, False, True, False, False), (service, False, True, False, False)]

    host = urlsplit(pg_server.base_dsn).netloc.split("@")[-1]
    # The generated secrets, on the test server: its host, the renamed roles and databases.
    for name in ("service_dsn", "sources.json"):
        text = (secrets / name).read_text()
        for role in ("tributary_service", "tributary_capture"):
            text = text.replace(f"//{role}:", f"//{role}_{suffix}:")
        for db in ("tributary", "shop"):
            text = re.sub(rf"@postgres:5432/{db}\b", f"@{host}/{db}_{suffix}", text)
        (secrets / name).write_text(text)
    capture_dsn = json.loads((secrets / "sources.json").read_text())[0]["dsn"]
    compose = yaml.safe_load((REPO_ROOT / "deploy" / "compose.yaml").read_text())
    init_service, files = compose["services"]["init"], compose["secrets"]
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TRIBUTARY_")}
    for key, value in init_service["environment"].items():  # a secret's path in the container → its file here
        env[key] = str(value)
        if key.endswith("_FILE"):
            secret = str(value).removeprefix("/run/secrets/")
            env[key] = str(secrets / Path(files[secret]["file"]).name)
    del env["TRIBUTARY_LOG__BACKEND"], env["TRIBUTARY_LOG__KAFKA"]  # the local log: no broker here
    env["TRIBUTARY_LOG__ROOT"] = str(tmp_path / "log")
    command = init_service["command"]
    assert command[0] == "tributary"
    tributary = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "tributary"
    try:
        init = run_process([str(tributary), *command[1:]], what="tributary init", env=env, cwd=tmp_path)
        assert init.returncode == 0, init.stdout[-2000:] + init.stderr[-2000:]
        with psycopg.connect(capture_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM orders").fetchone() == (3,)  # snapshots read
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("INSERT INTO orders (customer, total) VALUES ('x', 1)")
    finally:
        with pg_server.admin() as conn:
            for slot in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (shop,)):
                conn.execute("SELECT pg_drop_replication_slot(%s)", slot)
        for db in (service_db, shop):
            pg_server.drop_database(db)
        with pg_server.admin() as conn:
            for role in (service, capture):
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')  # noqa: S608 - our own generated name
