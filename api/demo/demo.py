"""`tributary demo`: everything on the embedded default, end to end, with one command.

Postgres → a sample shop that keeps writing → capture (the shop and the event store's outbox) →
the log → projections (PySpark, continuously) → the HTTP API and console, plus bank accounts
opened and used through that API. Ctrl-C, SIGTERM (or `--duration`) stops it all and prints a
summary. It keeps its cluster and log in a directory of its own (`.tributary/demo`), apart from
what `tributary pg up` and a `tributary.toml` use.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import psycopg
import typer
from psycopg import sql
from rich.console import Console

from tributary.api.cli.common import ConfigOption, settings_from
from tributary.api.cli.output import literal
from tributary.api.demo.shop import Workload, create_shop
from tributary.api.devdb.embedded import EmbeddedPostgres, listening_socket
from tributary.api.settings.config import Settings, SourceSettings
from tributary.api.settings.log import cleaner_policy
from tributary.api.settings.sources import source_specs
from tributary.capture.daemon import CaptureDaemon, DaemonOptions
from tributary.log import open_admin

if TYPE_CHECKING:  # imported when the demo serves the API
    import uvicorn

__all__ = ["register"]

DEMO_DB = "shop"
DEMO_SOURCE = "shop"  # topics shop.public.*, as in the README's Quick start
DEMO_PROJECTIONS = (
    "tributary.projections.examples.account_balances",
    "tributary.projections.examples.account_daily_totals",
)
DEMO_AGGREGATES = ("tributary.eventstore.examples.bank",)  # loaded like any user's domain
DEMO_MIRROR = (f"{DEMO_SOURCE}.public.orders",)
DEMO_DIR = Path(".tributary/demo")  # the demo's own cluster (pg/) and log (log/), never the Quick start's


def _ensure_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _demo_settings(base: Settings, service_dsn: str, shop_dsn: str, port: int, log_root: Path) -> Settings:
    """The user's settings with the demo's pieces filled in (service DB, the shop as a source, so
    that `/sources` and the console show it, projections, port, its own log)."""
    shop = SourceSettings(name=DEMO_SOURCE, dsn=shop_dsn, include=("public.*",))
    return base.model_copy(
        update={
            "service": base.service.model_copy(update={"dsn": service_dsn}),
            "log": base.log.model_copy(update={"root": log_root.absolute(), "backend": "local"}),
            "sources": [shop],
            "eventstore": base.eventstore.model_copy(update={"modules": DEMO_AGGREGATES}),
            "projections": base.projections.model_copy(
                update={"modules": DEMO_PROJECTIONS, "mirror": DEMO_MIRROR, "spark_master": "local[2]"}
            ),
            "api": base.api.model_copy(update={"host": "127.0.0.1", "port": port}),
        }
    )


class _Stage(threading.Thread):
    """A demo component in a thread: runs `body(stop)`. A failure is said at once (stderr, and
    `problems`, which the API's /healthz and the console show) and kept for the summary; an error
    raised once the demo is stopping is the stop cutting its work short, never a failure."""

    def __init__(
        self, name: str, body: Callable[[threading.Event], object], stop: threading.Event, problems: dict[str, str]
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.body, self.stop_event, self.problems = body, stop, problems
        self.error: str | None = None

    def run(self) -> None:
        try:
            self.body(self.stop_event)
        except Exception as exc:  # noqa: BLE001 - reported now and in the summary; the other stages go on
            if self.stop_event.is_set():
                return  # e.g. a Spark job cancelled, a connection closed by the stop
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.error = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            self.problems[self.name] = self.error
            print(f"tributary demo: {self.name} failed: {self.error}", file=sys.stderr, flush=True)


def _stop_on_signals() -> None:
    """SIGTERM (a service manager, `timeout`) stops the demo as Ctrl-C does: a KeyboardInterrupt,
    so the summary is printed and everything the demo started is stopped."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _ignore_signals() -> None:
    """While stopping (a few seconds, bounded), a second signal must not cut the clean-up short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def demo(
    config: ConfigOption = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration", metavar="SECONDS", help="Run this long, print a summary, exit 0 (1 if a stage failed)."
        ),
    ] = None,
    rate: Annotated[float, typer.Option(help="Shop workload transactions per second.")] = 20.0,
    directory: Annotated[
        Path,
        typer.Option("--dir", help="The demo's own cluster and log, apart from `pg up`'s and your config's."),
    ] = DEMO_DIR,
) -> None:
    """Run Postgres, a sample shop, capture, projections and the API, and print where to look.

    Runs until Ctrl-C or SIGTERM (or --duration seconds), then prints what every stage did and
    stops everything it started. Its cluster and log live in --dir (default .tributary/demo),
    so the README's Quick start, in the same checkout, starts clean."""
    base = settings_from(config)
    console = Console(highlight=False, soft_wrap=True)
    cluster = EmbeddedPostgres(directory / "pg")
    _stop_on_signals()
    run: _Run | None = None
    try:
        run = _Run(base, cluster, directory, rate, console)
        run.start("  Ctrl-C stops everything." if duration is None else f"  running for {duration:g}s")
        deadline = None if duration is None else time.monotonic() + duration
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        console.print("stopping …")
    finally:
        _ignore_signals()
        if run is not None:
            run.stop()
        if cluster.down():
            console.print(f"stopped the embedded Postgres (data kept in {cluster.data_dir})")
    if run is not None and run.problems:
        raise typer.Exit(1)


STOP_WAIT_S = 20.0  # how long the stages get to finish after a stop, together


class _Run:
    """The demo's pieces, started and stopped as one."""

    def __init__(self, base: Settings, cluster: EmbeddedPostgres, directory: Path, rate: float, console: Console):
        self.base, self.cluster, self.directory, self.rate, self.console = base, cluster, directory, rate, console
        self.stop_event = threading.Event()
        self.problems: dict[str, str] = {}  # stage → its failure, shown by /healthz and the console
        self.counts = {"accounts": 0, "commands": 0, "projection_runs": 0, "rows_written": 0, "waits": 0}
        self.stages: list[_Stage] = []
        self.workload: Workload | None = None
        self.daemon: CaptureDaemon | None = None
        self.server: uvicorn.Server | None = None
        self.settings = base

    def start(self, hint: str) -> None:
        """Postgres, the shop and its catalog, migrations, then every stage in its thread; print the URLs."""
        cluster, console = self.cluster, self.console
        service_dsn = cluster.up()
        shop_dsn = cluster.dsn(DEMO_DB)
        _ensure_database(cluster.dsn("postgres"), DEMO_DB)
        create_shop(shop_dsn)
        from tributary.eventstore.migrate import run_migrations

        run_migrations(service_dsn)
        listener = listening_socket(self.base.api.port)  # held until the API serves on it: no race for the port
        settings = self.settings = _demo_settings(
            self.base, service_dsn, shop_dsn, int(listener.getsockname()[1]), self.directory / "log"
        )
        url = f"http://127.0.0.1:{settings.api.port}"
        console.print(f"[bold]postgres[/]   {service_dsn} (sample shop in database {DEMO_DB!r})")
        stop, counts, rate = self.stop_event, self.counts, self.rate
        workload = self.workload = Workload(shop_dsn)
        workload.seed_catalog()

        specs = source_specs(settings, with_outbox=True)  # the shop and the event store's outbox
        daemon = self.daemon = CaptureDaemon(
            specs,
            DaemonOptions(
                log_root=settings.log.root,
                default_partitions=settings.log.partitions,
                linger_ms=settings.log.linger_ms,
                cleaner=cleaner_policy(settings),
            ),
        )

        def capture(stop_: threading.Event) -> None:
            daemon.run()

        def shop(stop_: threading.Event) -> None:
            while not stop_.is_set():
                workload.step()
                stop_.wait(1.0 / rate)

        import uvicorn

        from tributary.api.http.app import create_app

        app = create_app(settings, dsn=service_dsn)
        app.state.problems = self.problems
        server = self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=settings.api.port, log_level="warning", access_log=False)
        )

        api_over = threading.Event()

        def api(stop_: threading.Event) -> None:
            try:
                server.run(sockets=[listener])
            finally:
                api_over.set()

        def bank(stop_: threading.Event) -> None:
            """Open a few accounts through the API, then keep moving money."""
            while not server.started and not api_over.is_set() and not stop_.is_set():
                time.sleep(0.1)  # the API starting: as long as it takes on a loaded machine
            if not server.started:
                return  # it failed (its stage reports why) or the demo stops
            rng = random.Random(11)
            import httpx  # only the demo's own API client needs it

            with httpx.Client(base_url=url, timeout=30) as http:
                names = ["ada", "grace", "linus", "barbara"]
                for name in names:
                    r = http.post(
                        f"/commands/account/{name}",
                        json={"type": "open", "data": {"owner": name, "overdraft_limit": "100.00"}},
                    )
                    counts["accounts"] += r.status_code == 200
                while not stop_.is_set():
                    kind = rng.choice(["deposit", "deposit", "withdraw"])
                    amount = f"{rng.randint(1, 6000) / 100:.2f}"
                    r = http.post(
                        f"/commands/account/{rng.choice(names)}", json={"type": kind, "data": {"amount": amount}}
                    )
                    counts["commands"] += r.status_code == 200
                    stop_.wait(0.5)

        def projections(stop_: threading.Event) -> None:
            from tributary.projections.errors import LockedError
            from tributary.projections.loader import load
            from tributary.projections.runner import RunSettings, run

            run_settings = RunSettings.from_settings(settings, dsn=service_dsn)
            names = sorted(load(run_settings.modules, run_settings.mirror))
            stop_.wait(3)  # let capture take its snapshot first
            while not stop_.is_set():
                for name in names:
                    if stop_.is_set():
                        break
                    try:
                        result = run(name, run_settings)
                    except LockedError:  # a rebuild (the API's, the console's) holds it: carry on after it
                        counts["waits"] += 1
                        continue
                    counts["projection_runs"] += 1
                    counts["rows_written"] += result.rows
                stop_.wait(2)

        self.stages = [
            _Stage(n, b, stop, self.problems)
            for n, b in (
                ("capture", capture),
                ("shop", shop),
                ("api", api),
                ("bank", bank),
                ("projections", projections),
            )
        ]
        for stage in self.stages:
            stage.start()
        console.print(
            f"[bold]capture[/]    shop + event store → log {settings.log.root} "
            f"(topics {DEMO_SOURCE}.public.*, events.account)"
        )
        console.print(f"[bold]console[/]    {url}/   (API docs: {url}/docs)")
        console.print("[bold]try[/]")
        console.print(
            f"  curl -s -XPOST {url}/commands/account/ada -H 'content-type: application/json' "
            '-d \'{"type":"deposit","data":{"amount":"10.00"}}\''
        )
        console.print(f"  curl -s '{url}/views/account_balances?balance__lt=0'")
        console.print(f"  curl -s -XPOST {url}/projections/account_balances/rebuild")
        console.print(hint)

    def stop(self) -> None:
        """Stop every stage (Spark's running jobs cancelled, so a projection pass ends now), wait a
        bounded time for them, stop Spark's JVM, print the summary. A Spark still starting is not
        waited for: its JVM ends when this process does (it exits when its stdin closes)."""
        from tributary.projections.spark import cancel_jobs, has_session, stop_session

        self.stop_event.set()
        if self.daemon is not None:
            self.daemon.request_stop()
        if self.server is not None:
            self.server.should_exit = True
        deadline = time.monotonic() + STOP_WAIT_S
        for stage in self.stages:
            while stage.is_alive() and time.monotonic() < deadline:
                if stage.name == "projections" and not has_session():
                    break  # still starting Spark (20 s and more when busy): its JVM exits with this process
                cancel_jobs()  # again while waiting: a pass may begin once Spark has started
                stage.join(timeout=0.5)
        if has_session():
            stop_session()
        if self.workload is not None:
            self.workload.close()
            _summary(self.console, self.settings.log.root, self.workload.counts, self.counts, self.stages)


def _summary(console: Console, root: Path, shop: dict[str, int], counts: dict[str, int], stages: list[_Stage]) -> None:
    rows = open_admin(root=root, kafka=None).topics()  # the demo runs on the embedded default
    total = sum(t["records"] for t in rows)
    console.print("[bold]log[/]")
    for t in rows:
        console.print(f"  {t['topic']:<34} {t['records']:>7,} records ({t['policy']})")
    for stage in stages:
        if stage.error:
            console.print(f"[red]{literal(stage.name)} failed[/]: {literal(stage.error)}")
    console.print(
        f"[bold]summary[/] shop transactions={shop['transactions']:,}; records in log={total:,} (changes captured); "
        f"accounts opened={counts['accounts']}, commands accepted={counts['commands']:,} (events appended); "
        f"projection runs={counts['projection_runs']:,}, rows written={counts['rows_written']:,} (views refreshed; "
        f"{counts['waits']:,} waits for a rebuild)"
    )


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
