"""`tributary kafka up | down | status`: a local Apache Kafka (KRaft, one node) to point
`[log.kafka] bootstrap_servers` at while developing, as `tributary pg up` gives a local Postgres."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tributary.api.cli.common import UserError
from tributary.api.cli.help import SentenceGroup

__all__ = ["register"]

kafka_app = typer.Typer(
    cls=SentenceGroup,
    help=(
        "A local Apache Kafka broker (KRaft mode, one node on 127.0.0.1) for development and tests.\n\n"
        "`up` starts it and prints its bootstrap servers, for `[log.kafka] bootstrap_servers`; its jars come "
        "from `make setup` (build/kafka/lib)."
    ),
    no_args_is_help=True,
)

DataDirOption = Annotated[
    Path, typer.Option("--data-dir", help="The broker's directory: data, logs and state (default .tributary/kafka).")
]
DEFAULT_DIR = Path(".tributary/kafka")


@kafka_app.command("up")
def kafka_up(
    data_dir: DataDirOption = DEFAULT_DIR,
    port: Annotated[int | None, typer.Option(help="TCP port on 127.0.0.1 (default 9092 or a free one).")] = None,
) -> None:
    """Start (formatting on first use) the local broker and print its bootstrap servers."""
    from tributary.api.devkafka import BrokerError, EmbeddedKafka

    try:
        typer.echo(EmbeddedKafka(data_dir).up(port=port))
    except BrokerError as exc:
        raise UserError(str(exc)) from None


@kafka_app.command("down")
def kafka_down(data_dir: DataDirOption = DEFAULT_DIR) -> None:
    """Stop the local broker (its topics stay)."""
    from tributary.api.devkafka import EmbeddedKafka

    stopped = EmbeddedKafka(data_dir).down()
    typer.echo("stopped" if stopped else "not running", err=not stopped)


@kafka_app.command("status")
def kafka_status(data_dir: DataDirOption = DEFAULT_DIR) -> None:
    """Print the bootstrap servers of the running broker; fail if it is not running or does not answer."""
    from tributary.api.devkafka import EmbeddedKafka

    broker = EmbeddedKafka(data_dir)
    if not broker.is_running():
        raise UserError(f"the local Kafka in {broker.data_dir} is not running: run `tributary kafka up`")
    if not broker.live_brokers():
        raise UserError(f"the local Kafka at {broker.bootstraps} does not answer; its log: {broker.log_file(1)}")
    typer.echo(broker.bootstraps)


def register(app: typer.Typer) -> None:
    app.add_typer(kafka_app, name="kafka")
