"""`tributary groups list | describe GROUP | reset GROUP … | parked GROUP | replay-parked GROUP`: consumer groups, in kafka-consumer-groups'
vocabulary, straight on the service database and the log (no server needed)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tributary.api.cli.common import ConfigOption, UserError, service_dsn, settings_from
from tributary.api.cli.help import SentenceGroup

if TYPE_CHECKING:  # imported where used: these commands start without loading what they do not run
    from tributary.consumers import GroupCoordinator, ResetTarget

__all__ = ["register"]

groups_app = typer.Typer(
    cls=SentenceGroup,
    help=(
        "Consumer groups: who consumes what, how far behind, and replay.\n\n"
        "A group holds one committed offset per topic-partition (the next offset it reads); its live members "
        "share the partitions. `list` and `describe` show lag (records between the committed offset and the "
        "log's end); `reset` moves the committed offsets while no member is running, e.g. to replay a topic: "
        "`tributary groups reset billing --to-earliest --topic shop.public.orders`."
    ),
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (what GET /groups… answers).")]


@contextmanager
def _coordinator(config: Path | None) -> Iterator[GroupCoordinator]:
    from tributary.api.settings.log import kafka_options
    from tributary.consumers import GroupCoordinator
    from tributary.eventstore.migrate import require_initialized

    settings = settings_from(config)
    dsn = service_dsn(settings)
    require_initialized(dsn)
    c = settings.consumers
    with GroupCoordinator(
        dsn,
        settings.log.root,
        session_timeout_ms=c.session_timeout_ms,
        auto_offset_reset=c.auto_offset_reset,
        max_connections=1,
        kafka=kafka_options(settings),
        max_retries=c.max_retries,
        retry_backoff_ms=c.retry_backoff_ms,
        capture_sources=[s.name for s in settings.sources],
    ) as coordinator:
        yield coordinator


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells)


@groups_app.command("list")
def list_cmd(config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Every group: live members, generation (+1 per rebalance), total lag of its committed partitions."""
    with _coordinator(config) as c:
        rows = c.groups()
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        typer.echo("no consumer groups yet: a group appears when its first member joins (POST /groups/{group}/members)")
        return
    typer.echo(_table(["GROUP", "MEMBERS", "GENERATION", "LAG"], [list(r.values()) for r in rows]))


@groups_app.command("describe")
def describe_cmd(
    group: Annotated[str, typer.Argument(help="The group's name.")],
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Members (partitions held, last heartbeat) and per topic-partition: committed offset, log end,
    lag, last commit, and any reset past the log's retention (auto_offset_reset)."""
    with _coordinator(config) as c:
        d = c.describe(group)
    if d is None:
        raise UserError(f"no consumer group {group!r} (tributary groups list shows them)")
    if as_json:
        typer.echo(json.dumps(d, indent=1))
        return
    alive = [m for m in d["members"] if m["alive"]]
    typer.echo(
        f"group {group}: generation {d['generation']}, {d['state']}, {len(alive)} live member(s), lag {d['lag']}"
    )
    if d["members"]:
        typer.echo("")
        rows = [
            [
                m["member_id"],
                ",".join(f"{a['topic']}/{a['partition']}" for a in m["assignments"]) or "-",
                m["last_heartbeat"],
                "" if m["alive"] else "session timed out",
            ]
            for m in d["members"]
        ]
        typer.echo(_table(["MEMBER", "PARTITIONS", "LAST-HEARTBEAT", ""], rows))
    if d["partitions"]:
        typer.echo("")
        rows = [
            [p["topic"], p["partition"], p["member"], p["committed"], p["end"], p["lag"], p["last_commit"]]
            for p in d["partitions"]
        ]
        typer.echo(_table(["TOPIC", "PARTITION", "MEMBER", "COMMITTED", "END", "LAG", "LAST-COMMIT"], rows))
    for p in d["partitions"]:
        r = p["out_of_range"]
        if r:
            typer.echo(
                f"note: {p['topic']}/{p['partition']} was at offset {r['position']}, behind the log's retention "
                f"(first offset {r['start']}), at {r['at']}: auto_offset_reset={r['action']} moved it"
            )


def _timestamp_ms(text: str) -> int:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"--to-datetime {text!r} is not ISO-8601 (e.g. 2026-11-27T08:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


@groups_app.command("reset")
def reset_cmd(
    group: Annotated[str, typer.Argument(help="The group's name.")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest", help="The first offset the log still holds.")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="The log's end: skip everything so far.")] = False,
    to_datetime: Annotated[
        str | None,
        typer.Option(
            "--to-datetime",
            metavar="T",
            help="The first record at or after T (ISO-8601; no zone = UTC), found through the log's time index.",
        ),
    ] = None,
    to_offset: Annotated[
        int | None, typer.Option("--to-offset", metavar="N", min=0, help="Offset N (kept within what the log holds).")
    ] = None,
    topic: Annotated[
        str | None, typer.Option("--topic", metavar="T", help="Only topic T (default: every topic the group consumed).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the new offsets without writing them.")] = False,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move the group's committed offsets (replay or skip). Stop the group's members first: a reset
    is refused while any member is alive. Give exactly one --to-… option."""
    targets: tuple[tuple[ResetTarget, bool], ...] = (
        ("earliest", to_earliest),
        ("latest", to_latest),
        ("datetime", to_datetime is not None),
        ("offset", to_offset is not None),
    )
    chosen = [name for name, given in targets if given]
    if len(chosen) != 1:
        raise UserError("give exactly one of --to-earliest, --to-latest, --to-datetime T, --to-offset N")
    timestamp = _timestamp_ms(to_datetime) if to_datetime is not None else None
    with _coordinator(config) as c:
        out = c.reset(group, chosen[0], timestamp_ms=timestamp, offset=to_offset, topic=topic, dry_run=dry_run)
    if as_json:
        typer.echo(json.dumps({"group": group, "dry_run": dry_run, "offsets": out}, indent=1))
        return
    rows = [[o["topic"], o["partition"], o["previous"], o["offset"]] for o in out]
    typer.echo(_table(["TOPIC", "PARTITION", "PREVIOUS", "NEW"], rows))
    typer.echo(f"group {group}: " + ("dry run, nothing written" if dry_run else f"reset to {chosen[0]}"))


@groups_app.command("parked")
def parked_cmd(
    group: Annotated[str, typer.Argument(help="The group's name.")],
    state: Annotated[
        str | None, typer.Option("--state", metavar="S", help="Only parked, replaying or replayed records.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", metavar="N", min=1, help="At most N records.")] = 1000,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """The records the group's members parked (or nacked past max_retries), oldest first: where each
    was in the log, why, the attempts, and whether it was replayed."""
    if state not in (None, "parked", "replaying", "replayed"):
        raise UserError(f"--state {state!r}: use parked, replaying or replayed")
    from tributary.api.http.routes_group_parked import parked_json

    with _coordinator(config) as c:
        rows = c.parked(group, state=state, limit=limit)
    if as_json:
        typer.echo(json.dumps([json.loads(parked_json(r)) for r in rows], indent=1))
        return
    if not rows:
        typer.echo(f"group {group}: no parked records")
        return
    table = [
        [
            r["record"].topic,
            r["record"].partition,
            r["record"].offset,
            r["state"],
            r["attempts"],
            r["parked_at"],
            r["reason"],
        ]
        for r in rows
    ]
    typer.echo(_table(["TOPIC", "PARTITION", "OFFSET", "STATE", "ATTEMPTS", "PARKED-AT", "REASON"], table))


@groups_app.command("replay-parked")
def replay_parked_cmd(
    group: Annotated[str, typer.Argument(help="The group's name.")],
    topic: Annotated[str | None, typer.Option("--topic", metavar="T", help="Only topic T's parked records.")] = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Hand the group's parked records back to it: each is delivered again to the member holding its
    partition, before that partition's next records (members may be running)."""
    with _coordinator(config) as c:
        n = c.replay_parked(group, topic=topic)
    if as_json:
        typer.echo(json.dumps({"group": group, "replaying": n}))
        return
    typer.echo(f"group {group}: {n} parked record(s) handed back for replay")


def register(app: typer.Typer) -> None:
    app.add_typer(groups_app, name="groups")
