"""The console page in a real headless Chromium (Debian's chromium + chromium-driver, Selenium):
see a source and a projection, press rebuild, watch it finish; the screenshot is kept."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import cli
from tests.servers import free_port, served, serving
from tests.waiting import Stalled, tree_cpu_s, wait_progress
from tributary.eventstore.examples.bank import bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.store import EventStore

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def _browser(profile: Path):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def _wait(driver, predicate, what: str, server: subprocess.Popen[bytes] | None = None) -> None:  # type: ignore[no-untyped-def]
    """Wait for `predicate(driver)` while the page's words (its figures and clocks tick on their own)
    or `server`'s CPU time (a Spark job) move."""
    try:
        wait_progress(
            lambda: predicate(driver),
            lambda: (
                re.sub(r"\d", "", driver.find_element("tag name", "body").text),
                None if server is None else tree_cpu_s(server.pid),
            ),
            what=f"console: {what}",
            poll=0.5,
        )
    except Stalled:
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "console-timeout.png"))
        raise


def test_console_shows_sources_and_rebuilds_a_projection(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 20) g")
    store = EventStore.connect(fresh_db)
    handler = CommandHandler(store, {"account": bank_account()})
    handler.handle("account", "ada", "open", {"owner": "ada"})
    handler.handle("account", "ada", "deposit", {"amount": "42.00"})
    store.close()
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\npartitions = 2\n'
        f'[[sources]]\nname = "shop"\ndsn = "{fresh_db}"\nslot = "console_shop"\ninclude = ["public.*"]\n'
        f'[projections]\nmodules = ["tributary.projections.examples.account_balances"]\nspark_master = "local[2]"\n'
        f"[api]\nport = {port}\n"
    )
    assert (r := cli("init", "--config", str(config))).returncode == 0, r.stdout + r.stderr
    assert (r := cli("capture", "--config", str(config), "--until-idle", "2")).returncode == 0, r.stderr
    with served(config, port, err_path=tmp_path / "serve.err") as server:
        base = f"http://127.0.0.1:{port}"
        driver = _browser(tmp_path / "chromium-profile")
        try:
            driver.get(base + "/")
            _wait(driver, lambda d: "shop" in d.find_element("id", "sources").text, "the source row")
            _wait(driver, lambda d: "events.account" in d.find_element("id", "topics").text, "the topics")
            _wait(driver, lambda d: "account_balances" in d.find_element("id", "projections").text, "the projection")
            assert "stopped" in driver.find_element("id", "sources").text  # the capture run above ended cleanly
            driver.find_element("css selector", "button[data-rebuild='account_balances']").click()
            _wait(driver, lambda d: "done" in d.find_element("id", "projections").text, "the rebuild to finish", server)
            driver.find_element("id", "viewname").send_keys("account_balances")
            driver.find_element("css selector", "#viewform button[type=submit]").click()
            _wait(driver, lambda d: "ada" in d.find_element("id", "viewrows").text, "the view's rows")
            assert "42.00" in driver.find_element("id", "viewrows").text
            ARTIFACTS.mkdir(exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "console.png"))
        finally:
            driver.quit()


DOCS = """
from tributary.projections.definition import Projection, Table

PROJECTION = Projection(
    name="docs",
    version=1,
    topics=("none",),
    table=Table.of({"id": "bigint", "attrs": "jsonb", "tags": "jsonb"}, ["id"]),
    build=lambda df: df,
)
"""


def test_console_sends_its_key_in_a_header_and_shows_jsonb_as_json(fresh_db: str, tmp_path: Path) -> None:
    """With API keys configured the console asks for one and sends it as `Authorization`, never in
    the URL (which browsers keep in their history); jsonb cells read as JSON, not "[object Object]"."""
    from tributary.projections.definition import Projection, Table
    from tributary.projections.store import Store

    run_migrations(fresh_db)
    (tmp_path / "docs.py").write_text(DOCS)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        store = Store(conn)
        store.ensure()
        table = Table.of({"id": "bigint", "attrs": "jsonb", "tags": "jsonb"}, ["id"])
        build = store.new_build(Projection(name="docs", version=1, topics=("none",), table=table, build=len))
        store.swap(build)
        conn.execute(
            f'INSERT INTO views.{build.table_name} VALUES (1, \'{{"color": "red"}}\', \'["a", 2]\')'  # noqa: S608
        )
    port = free_port()
    secret = "console-key-0123456789"
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n'
        f'[projections]\nmodules = ["{tmp_path / "docs.py"}"]\n'
        f'[api]\nport = {port}\nkeys = [{{key = "{secret}", scopes = ["admin"]}}]\n'
    )
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        driver = _browser(tmp_path / "chromium-profile")
        try:
            driver.get(base + "/")
            _wait(driver, lambda d: d.find_element("id", "keyform").is_displayed(), "the key prompt (401)")
            driver.find_element("id", "key").send_keys(secret)
            driver.find_element("css selector", "#keyform button[type=submit]").click()
            _wait(driver, lambda d: "docs" in d.find_element("id", "projections").text, "the projection")
            driver.find_element("css selector", "#viewform button[type=submit]").click()
            _wait(driver, lambda d: "tags" in d.find_element("id", "viewrows").text, "the view's rows")
            cells = driver.find_element("id", "viewrows").text
            assert '{"color":"red"}' in cells and '["a",2]' in cells, cells
            assert "[object Object]" not in cells, cells
            assert secret not in driver.current_url
            driver.refresh()  # the key lives for the tab, not in the URL: still signed in
            _wait(driver, lambda d: "docs" in d.find_element("id", "projections").text, "the projection again")
            assert secret not in driver.current_url
        finally:
            driver.quit()


def test_console_shows_consumer_groups_with_members_generation_lag_and_last_commit(
    fresh_db: str, tmp_path: Path
) -> None:
    import httpx

    from tests.integration.projections.helpers import LogWriter

    run_migrations(fresh_db)
    writer = LogWriter(tmp_path / "log")
    writer.topic("events.account", partitions=2)
    for i in range(9):
        writer.append("events.account", f"s{i}", 1, "Opened", 1_000 + i)
    writer.commit()
    writer.close()
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n[api]\nport = {port}\n')
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        joined = httpx.post(
            base + "/groups/billing/members",
            json={"topics": ["events.account"], "member_id": "worker-7", "auto_offset_reset": "earliest"},
        ).json()
        offsets = [{"topic": "events.account", "partition": p, "offset": 1} for p in range(2)]
        committed = httpx.post(
            base + "/groups/billing/members/worker-7/commit",
            json={"generation": joined["generation"], "offsets": offsets},
        )
        assert committed.status_code == 200, committed.text
        driver = _browser(tmp_path / "chromium-profile")
        try:
            driver.get(base + "/")
            _wait(driver, lambda d: "worker-7" in d.find_element("id", "groups").text, "the group's row")
            row = driver.find_element("id", "groups").text
            assert "billing" in row and "events.account/0, events.account/1" in row
            assert f"billing {joined['generation']} " in row and " 7 " in row  # lag: 9 records - 2 committed
            ARTIFACTS.mkdir(exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "console-groups.png"))
        finally:
            driver.quit()


VISITS = """
from tributary.projections.definition import Projection, Table

PROJECTION = Projection(
    name="visits",
    version=1,
    topics=("shop.public.visits",),
    table=Table.of({"page": "text", "n": "bigint"}, ["page"]),
    build=lambda df: df,
)
"""


def test_console_shows_capture_warnings_and_errors_and_a_projection_behind(fresh_db: str, tmp_path: Path) -> None:
    """Capture's warnings under their source's row with a count, a failing source's error line, and
    a projection whose serving build says `done` while records wait shown `behind`, never `done`."""
    from psycopg.conninfo import make_conninfo

    from tributary.projections.definition import Projection, Table
    from tributary.projections.store import Store

    run_migrations(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE visits (page text, n int)")  # no key: keyed by the whole row
        conn.execute("ALTER TABLE visits REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO visits SELECT 'page ' || g, g FROM generate_series(1, 7) g")
    (tmp_path / "visits.py").write_text(VISITS)
    port = free_port()
    config = tmp_path / "t.toml"
    head = (
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\npartitions = 1\n'
        f'[[sources]]\nname = "shop"\ndsn = "{fresh_db}"\nslot = "console_warn"\ninclude = ["public.visits"]\n'
    )
    tail = f'[projections]\nmodules = ["{tmp_path / "visits.py"}"]\n[api]\nport = {port}\n'
    config.write_text(head + tail)
    assert (r := cli("init", "--config", str(config))).returncode == 0, r.stdout + r.stderr
    broken = make_conninfo(fresh_db, dbname="no_such_database", connect_timeout="5")
    config.write_text(head + f'[[sources]]\nname = "broken"\ndsn = "{broken}"\nslot = "console_broken"\n' + tail)
    r = cli("capture", "--config", str(config), "--until-idle", "2")
    assert r.returncode != 0 and "no_such_database" in r.stderr, r.stderr  # a batch run that missed a source
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # a build that serves, its status `done`, unfed
        store = Store(conn)
        store.ensure()
        table = Table.of({"page": "text", "n": "bigint"}, ["page"])
        projection = Projection(name="visits", version=1, topics=("shop.public.visits",), table=table, build=len)
        store.swap(store.new_build(projection))
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        driver = _browser(tmp_path / "chromium-profile")
        try:
            driver.get(base + "/")
            _wait(driver, lambda d: "keyed by the whole row" in d.find_element("id", "sources").text, "the warning")
            _wait(driver, lambda d: "visits" in d.find_element("id", "projections").text, "the projection")
            shop = driver.find_element("css selector", "#sources tr.detail[data-source='shop']").text
            assert "public.visits has no primary key: its records are keyed by the whole row" in shop, shop
            badge = driver.find_element("css selector", "#sources .badge").text
            assert badge.endswith("warning" if badge.startswith("1 ") else "warnings") and badge[0].isdigit(), badge
            failing = driver.find_element("css selector", "#sources tr.detail[data-source='broken'] .source-error")
            assert "no_such_database" in failing.text and failing.is_displayed(), failing.text
            cell = driver.find_element("css selector", "#projections td[data-state]")
            assert cell.get_attribute("data-state") == "behind", cell.text
            assert cell.text.startswith("behind (") and cell.text.endswith(" records)"), cell.text
            assert "done" not in driver.find_element("id", "projections").text
            colors = driver.execute_script(
                "const e = document.createElement('span'); e.className = 'state-running'; document.body.append(e);"
                "const c = [getComputedStyle(arguments[0]).color, getComputedStyle(e).color]; e.remove(); return c;",
                cell,
            )
            assert colors[0] == colors[1], colors  # amber, as a run under way; not green
            assert not driver.find_element("id", "keyform").is_displayed()  # no keys configured: no prompt
            ARTIFACTS.mkdir(exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "console-warnings.png"))
        finally:
            driver.quit()


BROKEN = "from tributary.projections.definition import Projection\nPROJECTION = Projection(\n"


def test_console_shows_a_projection_file_that_does_not_load(fresh_db: str, tmp_path: Path) -> None:
    """A projection file saved half-way: the console names the file and its error (in the projections
    table and the header), and keeps showing the projections that load."""
    run_migrations(fresh_db)
    broken = tmp_path / "half_saved.py"
    broken.write_text(BROKEN)
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n'
        f'[projections]\nmodules = ["tributary.projections.examples.account_balances", "{broken}"]\n'
        f"[api]\nport = {port}\n"
    )
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        driver = _browser(tmp_path / "chromium-profile")
        try:
            driver.get(base + "/")
            _wait(driver, lambda d: str(broken) in d.find_element("id", "projections").text, "the broken file")
            table = driver.find_element("id", "projections").text
            assert "account_balances" in table and "not loadable" in table and "SyntaxError" in table, table
            _wait(driver, lambda d: "[projections] modules" in d.find_element("id", "problems").text, "header")
            assert str(broken) in driver.find_element("id", "problems").text
        finally:
            driver.quit()
