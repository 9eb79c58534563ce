"""`tributary demo`: everything on the embedded default, end to end, with one command."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Annotated

import psycopg
import typer
from psycopg import sql
from rich.console import Console

from api.cli_common import ConfigOption, settings_from
from api.embedded_pg import EmbeddedPostgres
from api.shop import Workload, create_shop
from capture.daemon import CaptureDaemon, DaemonOptions
from capture.log import Log
from capture.source import SourceSpec

__all__ = ["register"]

DEMO_DB = "shop"
DEMO_SOURCE = "demo"


def _ensure_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def demo(
    config: ConfigOption = None,
    duration: Annotated[
        float | None, typer.Option("--duration", metavar="SECONDS", help="Run this long, print a summary, exit 0.")
    ] = None,
    rate: Annotated[float, typer.Option(help="Workload transactions per second.")] = 20.0,
) -> None:
    """Start Postgres, create a sample shop and keep writing to it, capture it into the log, show it.

    Runs until Ctrl-C (or --duration seconds), then prints what was captured.
    """
    settings = settings_from(config)
    console = Console(highlight=False, soft_wrap=True)
    cluster = EmbeddedPostgres(settings.pg_data_dir)
    started_here = not cluster.is_running()
    dsn = cluster.up()
    shop_dsn = cluster.dsn(DEMO_DB)
    _ensure_database(cluster.dsn("postgres"), DEMO_DB)
    create_shop(shop_dsn)
    console.print(f"[bold]postgres[/]  {dsn} (sample shop in database {DEMO_DB!r})")

    workload = Workload(shop_dsn)
    workload.seed_catalog()
    spec = SourceSpec(
        name=DEMO_SOURCE,
        dsn=shop_dsn,
        slot="tributary_demo",
        include=("public.*",),
        exclude=(),
        snapshot="initial",
        partitions=settings.log.partitions,
    )
    root = settings.log.root
    daemon = CaptureDaemon(
        [spec],
        DaemonOptions(log_root=root, default_partitions=settings.log.partitions, linger_ms=settings.log.linger_ms),
    )
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            workload.step()
            stop.wait(1.0 / rate)

    writer = threading.Thread(target=write, name="workload", daemon=True)
    capture = threading.Thread(target=daemon.run, name="capture", daemon=True)
    capture.start()
    writer.start()
    console.print(f"[bold]capture[/]   {shop_dsn} -> log {root} (topics {DEMO_SOURCE}.public.*)")
    console.print("[bold]try[/]       in another terminal:")
    console.print(f"            .venv/bin/tributary log topics --root {root}")
    console.print(f"            .venv/bin/tributary log cat {DEMO_SOURCE}.public.orders --root {root} --follow")
    console.print(
        "            Ctrl-C stops everything." if duration is None else f"            running for {duration:g}s"
    )
    try:
        deadline = None if duration is None else time.monotonic() + duration
        while deadline is None or time.monotonic() < deadline:
            if not capture.is_alive():
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        console.print("stopping …")
    finally:
        stop.set()
        writer.join(timeout=10)
        daemon.request_stop()
        capture.join(timeout=30)
        workload.close()
    _summary(console, root, workload.counts)
    if started_here:
        cluster.down()
        console.print("stopped the embedded Postgres (data kept in " + str(cluster.data_dir) + ")")


def _summary(console: Console, root: Path, counts: dict[str, int]) -> None:
    with Log.open(root) as log:
        topics = log.topics()
        total = 0
        console.print("[bold]log[/]")
        for name in sorted(topics):
            n = sum(e - s for s, e in zip(log.start_offsets(name), log.end_offsets(name), strict=True))
            total += n
            console.print(f"  {name:<34} {n:>7,} records")
        orders = (
            [
                r
                for p in range(topics[f"{DEMO_SOURCE}.public.orders"].partitions)
                for r in log.read(f"{DEMO_SOURCE}.public.orders", p)
            ]
            if f"{DEMO_SOURCE}.public.orders" in topics
            else []
        )
    if orders:
        console.print("[bold]last order change[/]")
        typer.echo(max(orders, key=lambda r: (r.timestamp, r.partition, r.offset)).to_json().decode())
    console.print(
        f"[bold]summary[/] workload transactions={counts['transactions']:,} inserts={counts['inserts']:,} "
        f"updates={counts['updates']:,} deletes={counts['deletes']:,}; records in log={total:,}"
    )


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
