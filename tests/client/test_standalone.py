"""tributary-client stands alone: its wheel, installed by pip into a fresh environment, brings only
httpx and orjson (and what they need), none of the service's dependencies, and consumes from a
real `tributary serve` there (the README's client example, as written)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tributary_client import Consumer

from tests.client.standalone import Standalone
from tests.integration.consumers.helpers import Filler, write_config
from tests.servers import ROOT, free_port, served
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.integration

TOPIC = "shop.public.orders"
# The service's heavy dependencies (and the service itself): a consumer needs none of them.
FORBIDDEN = ("tributary", "pyspark", "confluent_kafka", "psycopg", "psycopg_pool", "sqlalchemy", "pandas", "pyarrow")

PROBE = """
import importlib.metadata as md, importlib.util, json, re, sys
import tributary_client

def name(requirement):
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()

installed = {name(d.metadata["Name"]): d for d in md.distributions()}
closure, todo = set(), ["tributary-client"]
while todo:  # what tributary-client needs, and what that needs, as installed (extras left out)
    n = todo.pop()
    if n in closure or n not in installed:
        continue
    closure.add(n)
    todo += [name(r) for r in installed[n].requires or [] if "extra ==" not in r]
print(json.dumps({
    "file": tributary_client.__file__,
    "version": tributary_client.__version__,
    "dist_version": md.version("tributary-client"),
    "requires": sorted(name(r) for r in md.requires("tributary-client") or []),
    "installed": sorted(installed),
    "closure": sorted(closure),
    "importable": [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None],
}))
"""


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- client-example -->\n```python\n(.*?)```", text, re.S)
    assert match, "README.md lost its client example"
    return match.group(1)


def test_the_wheel_installs_alone_with_httpx_and_orjson(standalone: Standalone, tmp_path: Path) -> None:
    out = standalone.run(["-c", PROBE, *FORBIDDEN], tmp_path)
    assert out.returncode == 0, out.stderr
    probe = json.loads(out.stdout)
    assert Path(probe["file"]).is_relative_to(standalone.python.parent.parent)  # the wheel's copy, not the checkout
    assert probe["requires"] == ["httpx", "orjson"]
    assert probe["version"] == probe["dist_version"]
    assert probe["importable"] == []
    assert set(probe["installed"]) == set(probe["closure"]), "the fresh environment holds more than the client needs"
    assert {"httpx", "orjson", "tributary-client"} <= set(probe["installed"])


def test_the_readme_example_consumes_from_serve_in_the_fresh_environment(
    standalone: Standalone, fresh_db: str, tmp_path: Path
) -> None:
    run_migrations(fresh_db)
    filler = Filler(tmp_path / "log")
    filler.topic(TOPIC, partitions=2)
    filler.write(TOPIC, [(f"k{i}", {"id": i}) for i in range(6)])
    port = free_port()
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", port=port)
    url = f"http://127.0.0.1:{port}"
    try:
        with served(config, port, err_path=tmp_path / "serve.err"):
            run = standalone.run(["-c", _readme_example(), url], tmp_path)
            assert run.returncode == 0, run.stderr
            assert sorted(run.stdout.splitlines()) == sorted(f"{TOPIC} \"k{i}\" {{'id': {i}}}" for i in range(6))
            # It committed from there: the same group has nothing left to read.
            with Consumer(url, group="billing", topics=[TOPIC]) as again:
                assert again.poll(timeout_ms=500) == []
    finally:
        filler.close()
