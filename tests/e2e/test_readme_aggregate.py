"""README's "Writing an aggregate", run as written: its domain file, its config and its curl commands
against `tributary serve`, so the example cannot rot."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port, serving
from tests.waiting import run_process
from tributary.eventstore.errors import CommandRejected
from tributary.eventstore.loader import load_aggregates
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def section_blocks() -> dict[str, str]:
    """The section's code blocks by language (one each)."""
    text = README.read_text()
    section = text.split("\n## Writing an aggregate\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section, flags=re.S | re.M)
    assert [lang for lang, _ in blocks] == ["python", "toml", "sh"]
    return dict(blocks)


def write_domain(root: Path) -> Path:
    source = section_blocks()["python"]
    first = source.splitlines()[0]
    assert first.startswith("# ") and first.endswith(".py"), first
    path = root / first.removeprefix("# ")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def test_the_example_domain_follows_its_own_rules(tmp_path: Path) -> None:
    order = load_aggregates([str(write_domain(tmp_path))])["order"]
    state = order.initial()
    placed = order.decide(state, order.parse_command("place", {"customer": "ada", "items": ["tea"]}))
    state = order.evolve(state, placed[0])
    with pytest.raises(CommandRejected, match="place_once"):
        order.decide(state, order.parse_command("place", {"customer": "bob", "items": ["jam"]}))
    lifted = order.load_event("OrderPlaced", 1, {"customer": "ada", "item": "tea"})  # a stored v1 event
    assert lifted == placed[0]


def test_the_example_type_checks_strictly(tmp_path: Path) -> None:
    """The file API is typed: the example passes `mypy --strict` (against the checkout's package)."""
    domain = write_domain(tmp_path / "src")
    package = tmp_path / "typecheck" / "tributary"  # the installed layout, as `make lint` builds it
    package.mkdir(parents=True)
    for name in ("api", "capture", "eventstore", "projections", "migrations"):
        (package / name).symlink_to(ROOT / name)
    (package / "__init__.py").symlink_to(ROOT / "tributary" / "__init__.py")
    run = run_process(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(domain),
        ],
        what="mypy --strict",
        env={"MYPYPATH": str(tmp_path / "typecheck"), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_example_runs_as_written(fresh_db: str, tmp_path: Path) -> None:
    blocks = section_blocks()
    write_domain(tmp_path)
    run_migrations(fresh_db)
    port = free_port()
    config = tmp_path / "tributary.toml"  # the README's block, plus where this test's database and port are
    config.write_text(
        blocks["toml"] + f'\n[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n[api]\nport = {port}\n'
    )
    with serving(config, port, err_path=tmp_path / "serve.err") as base:  # cwd: the checkout, not tmp_path
        script = "set -euo pipefail\n" + blocks["sh"].replace("localhost:8000", f"localhost:{port}")
        run = run_process(["bash", "-c", script], what="the README's commands")
        assert run.returncode == 0, run.stderr
        placed, shipped, state = (json.loads(line) for line in run.stdout.splitlines())
        assert placed["version"] == 1 and placed["events"][0]["type"] == "OrderPlaced"
        assert placed["events"][0]["schema_version"] == 2
        assert placed["events"][0]["data"] == {"customer": "ada", "items": ["tea", "scones"]}
        assert shipped["events"][0]["type"] == "OrderShipped"
        assert state["status"] == "shipped" and state["version"] == 2 and state["stream_type"] == "order"
        with httpx.Client(base_url=base, timeout=10) as client:
            rejected = client.post("/commands/order/o-1", json={"type": "cancel", "data": {}})
            assert rejected.status_code == 422 and rejected.json()["rule"] == "must_be_placed"
            invalid = client.post("/commands/order/o-2", json={"type": "place", "data": {"customer": "", "items": []}})
            assert invalid.status_code == 422 and invalid.json()["code"] == "invalid_command"
            doc = client.get("/openapi.json").json()
            assert "/commands/order/{stream_id}" in doc["paths"] and "/commands/account/{stream_id}" in doc["paths"]
            assert {"order.Place", "order.Command", "order.OrderPlaced", "order.Event"} <= set(
                doc["components"]["schemas"]
            )
