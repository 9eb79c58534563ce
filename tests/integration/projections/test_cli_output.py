"""What `tributary project run|rebuild` prints: the result, or ONE line naming the projection, the
record and the Python exception — never Spark's or the JVM's start-up chatter or stack traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.capture.helpers import cli
from tests.integration.projections.helpers import DAY, LogWriter
from tributary.eventstore.migrate import run_migrations

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "events.account"
PROJECTION_FILE = """
from decimal import Decimal
from tributary.projections.definition import Fold, Projection, Table

def initial(key):
    return {"id": key, "balance": "0"}

def apply(state, record):
    amount = Decimal(record.data["amount"])
    if amount < 0:
        raise ValueError(f"negative amount {amount}")
    return {**state, "balance": str(Decimal(state["balance"]) + amount)}

def result(state):
    return {"account_id": state["id"], "balance": state["balance"]}

PROJECTION = Projection(
    name="balances", version=1, topics=("events.account",),
    table=Table.of({"account_id": "text", "balance": "numeric(20,2)"}, ["account_id"]),
    fold=Fold(initial=initial, apply=apply, result=result),
)
"""
# Lines the JVM, log4j or Spark print on their own when nobody configures them.
NOISE = ("Using incubator modules", "setLogLevel", "log4j", "WARN ", "ERROR ", "NativeCodeLoader", "Exception in task")


def _setup(tmp_path: Path, dsn: str, amounts: list[str]) -> Path:
    run_migrations(dsn)  # what `tributary init` does: projections refuse to run before it
    w = LogWriter(tmp_path / "log")
    w.topic(TOPIC, partitions=1)
    for i, amount in enumerate(amounts):
        w.append(TOPIC, "alice", i + 1, "MoneyDeposited", DAY + i, amount=amount)
    w.commit()
    w.close()
    (tmp_path / "balances.py").write_text(PROJECTION_FILE)
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp_path / "log"}"\n'
        f'[projections]\nmodules = ["{tmp_path / "balances.py"}"]\nspark_master = "local[1]"\n'
    )
    return config


def _noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(n in line for n in NOISE)]


def test_a_run_prints_its_result_and_no_spark_chatter(fresh_db: str, tmp_path: Path) -> None:
    config = _setup(tmp_path, fresh_db, ["1.00", "2.50"])
    r = cli("project", "run", "balances", "--config", str(config), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "balances: rebuilt build 1" in r.stdout
    assert _noise(r.stderr) == [], r.stderr[-3000:]
    assert r.stderr.strip() == "", r.stderr[-3000:]


@pytest.mark.parametrize("command", ["run", "rebuild"])
def test_a_failing_fold_prints_one_line(fresh_db: str, tmp_path: Path, command: str) -> None:
    config = _setup(tmp_path, fresh_db, ["1.00", "-2.00", "3.00"])
    r = cli("project", command, "balances", "--config", str(config), timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-5000:]
    assert lines[0].startswith(
        "tributary: projection 'balances' failed on events.account/0@1: ValueError: negative amount -2.00"
    ), lines[0]
    assert "Python worker" not in lines[0] and "Traceback" not in lines[0]
    log = (tmp_path / "project.log").read_text()  # the full trace is in the log the line names
    assert str(tmp_path / "project.log") in lines[0]
    assert "Traceback" in log and "negative amount -2.00" in log and "def apply" not in lines[0]
