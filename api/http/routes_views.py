"""`GET /views` and `GET /views/{name}`: query derived tables with declared-column filters.

Filters only on the projection's declared columns, values always bound as parameters and cast to
the declared type; keyset pagination over (order column, primary key) with an opaque cursor.
"""

from __future__ import annotations

import asyncio
import base64
import decimal
import itertools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

import orjson
import psycopg
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from psycopg import sql
from psycopg.adapt import AdaptersMap
from psycopg.types.string import TextLoader
from starlette.types import Scope

from tributary.api.http import pg_pipeline
from tributary.api.http.auth import AUTH_RESPONSES, error, require

__all__ = ["fast_page", "router", "runtime"]

_check_read = require("read")


async def _read_scope(request: Request) -> None:
    """`require("read")` run on the event loop: a sync dependency would cost a thread-pool hop per request."""
    _check_read(request)


router = APIRouter(tags=["views"], dependencies=[Depends(_read_scope)], responses=AUTH_RESPONSES)

MAX_LIMIT = 1000
_OPS = {"eq": "=", "ne": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}  # `col__op=v`; plain `col=v` is eq
_RESERVED = {"limit", "cursor", "order_by"}
_MAX_SHAPES = 4096


def _projections(state: Any) -> dict[str, Any]:
    """The configured projections, loaded once per app (they are configuration, not data)."""
    cached = getattr(state, "projections", None)
    if cached is None:
        from tributary.projections.loader import load

        settings = state.settings
        cached = state.projections = dict(load(tuple(settings.projections.modules), tuple(settings.projections.mirror)))
    return cached


def _default(obj: Any) -> Any:
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    raise TypeError


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body, default=_default), media_type="application/json")


@router.get("/views")
async def list_views(request: Request) -> Response:
    """Each view: name, columns with types, primary key, projection version, serving build."""
    projections = await asyncio.to_thread(_projections, request.app.state)
    builds: dict[str, Any] = {}
    async with request.app.state.pool.connection() as conn:
        try:
            cur = await conn.execute(
                "SELECT projection, build, version, table_name, finished_at "
                "FROM tributary_projections.builds WHERE current"
            )
            builds = {r[0]: r for r in await cur.fetchall()}
        except Exception:  # noqa: BLE001 - no projection has run yet: the builds table is missing
            builds = {}
    out = []
    for name, p in sorted(projections.items()):
        b = builds.get(name)
        out.append(
            {
                "name": name,
                "projection_version": p.version,
                "columns": [{"name": c.name, "type": c.type} for c in p.table.columns],
                "primary_key": list(p.table.primary_key),
                "build": b[1] if b else None,
                "table": b[3] if b else None,
                "updated_at": b[4].isoformat() if b and b[4] else None,
            }
        )
    return _json(out)


def _parse_filters(params: Mapping[str, str], types: dict[str, str]) -> list[tuple[str, str, str]]:
    filters = []
    unknown = []
    for raw, value in params.items():
        if raw in _RESERVED:
            continue
        column, sep, op = raw.partition("__")
        sql_op = _OPS.get(op) if sep else "="  # `col__=v` names no operator: unknown
        if column not in types or sql_op is None:
            unknown.append(raw)
            continue
        filters.append((column, sql_op, value))
    if unknown:
        raise HTTPException(
            422,
            f"unknown column or operator: {', '.join(sorted(unknown))} "
            f"(columns: {', '.join(types)}; operators: {', '.join(_OPS)})",
        )
    return filters


def _encode_cursor(values: list[Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(values, default=_default)).decode().rstrip("=")


def _decode_cursor(cursor: str, width: int) -> list[Any]:
    try:
        values = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        raise HTTPException(422, "cursor is not one this API returned") from None
    if (
        not isinstance(values, list)
        or len(values) != width
        or not all(v is None or (isinstance(v, str | int | float) and not isinstance(v, bool)) for v in values)
    ):
        raise HTTPException(422, "cursor is not one this API returned")
    return values


class _Runtime:
    """What a page query needs from the app, in one object: every `app.state.x` is a Python
    `__getattr__` call (≈ 0.5 µs), and a point lookup made seven of them."""

    __slots__ = ("connections", "keys", "meta", "queries", "schema")

    def __init__(self, state: Any) -> None:
        self.connections: pg_pipeline.Pipelines = state.view_connections
        self.keys = bool(state.settings.api.keys)
        self.schema: str = state.settings.projections.schema_
        self.meta: dict[str, _View] = {}  # per view, derived once from its projection
        # Rendered SQL by request shape (view, filter columns and operators, order, cursor, limit):
        # composing and quoting it costs more than running a point lookup; projections are fixed per app.
        self.queries: dict[tuple[Any, ...], Any] = {}


def runtime(state: Any) -> _Runtime | None:
    """The app's `_Runtime`, once its pool is up (`None` before); callers may keep it."""
    runtime = getattr(state, "views_runtime", None)
    if runtime is None and hasattr(state, "view_connections"):
        runtime = state.views_runtime = _Runtime(state)
    return runtime


def _columns(names: list[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(k) for k in names)


def _casts(names: list[str], types: dict[str, str], number: Iterator[int]) -> sql.Composed:
    """One placeholder per name, cast to the column's declared type."""
    return sql.SQL(", ").join(
        sql.SQL("CAST(${} AS {})").format(sql.SQL(str(next(number))), sql.SQL(types[k])) for k in names
    )


def _compose(
    schema: str,
    name: str,
    types: dict[str, str],
    filters: tuple[tuple[str, str], ...],
    keys: list[str],
    *,
    descending: bool,
    after: bool,
    limit: int,
    nullable: bool = False,
    after_null: bool = False,
) -> sql.Composed:
    number = itertools.count(1)  # libpq's `$n` placeholders, in the order of the arguments
    where: list[sql.Composable] = [
        sql.SQL("{} {} CAST(${} AS {})").format(
            sql.Identifier(column), sql.SQL(op), sql.SQL(str(next(number))), sql.SQL(types[column])
        )
        for column, op in filters
    ]
    if after:
        op = sql.SQL("<" if descending else ">")
        row = _columns(keys)
        # the cursor's values follow the filters' (with no order value when it is NULL: not sent)
        cursor = _casts(keys[1:] if after_null else keys, types, number)
        if not nullable:  # the order column is part of the key: never NULL
            where.append(sql.SQL("({}) {} ({})").format(row, op, cursor))
        else:  # NULLs sort last ascending, first descending; a row comparison with NULL is NULL, not false
            col = sql.Identifier(keys[0])
            if after_null:  # the cursor row's order value is NULL
                form = "({} IS NOT NULL OR ({}) {} ({}))" if descending else "({} IS NULL AND ({}) {} ({}))"
                where.append(sql.SQL(form).format(col, _columns(keys[1:]), op, cursor))
            elif descending:
                where.append(sql.SQL("({}) {} ({})").format(row, op, cursor))
            else:
                where.append(sql.SQL("(({}) {} ({}) OR {} IS NULL)").format(row, op, cursor, col))
    direction = sql.SQL(" DESC" if descending else "")
    return sql.SQL("SELECT {} FROM {}.{} {} ORDER BY {} LIMIT {}").format(
        _columns(list(types)),
        sql.Identifier(schema),
        sql.Identifier(name),
        sql.SQL("WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
        sql.SQL(", ").join(sql.Identifier(k) + direction for k in keys),
        sql.Literal(limit + 1),
    )


@router.get(
    "/views/{name}",
    responses={
        404: error("no such view, or not built yet"),
        422: error("unknown column or operator, bad value, limit or cursor"),
    },
)
async def query_view(
    name: str, request: Request, limit: int = 100, cursor: str | None = None, order_by: str | None = None
) -> Response:
    """Rows of `views.<name>`: `?col=v`, `?col__gte=v` (eq ne gt gte lt lte), `order_by=col|-col`,
    `limit` (≤ 1000), `cursor` from the previous page's `next_cursor`."""
    state = request.app.state
    views = runtime(state)
    if views is None:
        raise HTTPException(503, "starting up: the database pool is not open yet")
    body = await _page(state, views, name, request.query_params, limit, cursor, order_by)
    return Response(body, media_type="application/json")


class _View(NamedTuple):
    """What a page of one view needs, derived once per app from its projection."""

    types: dict[str, str]  # column -> declared SQL type, in table order
    primary_key: tuple[str, ...]
    row: Callable[[Sequence[Any]], dict[str, Any]]  # a result row -> its JSON object


def _view(state: Any, cached: dict[str, _View], name: str) -> _View | None:
    view = cached.get(name)
    if view is None:
        p = _projections(state).get(name)
        if p is None:
            return None
        types = {c.name: c.type for c in p.table.columns}
        view = cached[name] = _View(types, tuple(p.table.primary_key), _row_builder(list(types)))
    return view


def _row_builder(names: list[str]) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """`lambda r: {"id": r[0], ...}`: a dict display is half the cost of `dict(zip(names, r))`
    (measured: 14 vs 31 µs for a 100-row page). The names are `repr()` literals, never code."""
    body = ", ".join(f"{n!r}: r[{i}]" for i, n in enumerate(names))
    return eval(f"lambda r: {{{body}}}", {})  # type: ignore[no-any-return]


# Views read `numeric` as PostgreSQL's own text, which the JSON body carries as a string anyway: no
# Decimal per value and no `default=` call per value in orjson.
_ADAPTERS = AdaptersMap(psycopg.adapters)
_ADAPTERS.register_loader("numeric", TextLoader)


async def _page(
    state: Any,
    runtime: _Runtime,
    name: str,
    params: Mapping[str, str],
    limit: int,
    cursor: str | None,
    order_by: str | None,
) -> bytes:
    """The JSON body of one page of a view (the route and `fast_page` share it)."""
    view = _view(state, runtime.meta, name)
    if view is None:
        raise HTTPException(404, f"no view named {name!r}; GET /views lists them")
    types, primary_key = view.types, view.primary_key
    filters = _parse_filters(params, types)
    if not 1 <= limit <= MAX_LIMIT:
        raise HTTPException(422, f"limit must be between 1 and {MAX_LIMIT}")
    descending = bool(order_by and order_by.startswith("-"))
    order_col = order_by.lstrip("-") if order_by else None
    if order_col is not None and order_col not in types:
        raise HTTPException(422, f"cannot order by unknown column {order_col!r}")
    keys = ([order_col] if order_col and order_col not in primary_key else []) + list(primary_key)
    if order_col in primary_key:
        keys = [order_col] + [k for k in primary_key if k != order_col]

    args: list[Any] = [value for _, _, value in filters]
    nullable = keys[0] not in primary_key
    after_null = False
    if cursor:
        values = _decode_cursor(cursor, len(keys))
        after_null = nullable and values[0] is None
        args.extend(values[1:] if after_null else values)
    shape = (name, tuple([(c, op) for c, op, _ in filters]), tuple(keys), descending, bool(cursor), after_null, limit)
    queries = runtime.queries
    query = queries.get(shape)
    if query is None:
        query = _compose(
            runtime.schema,
            name,
            types,
            shape[1],
            keys,
            descending=descending,
            after=bool(cursor),
            limit=limit,
            nullable=nullable,
            after_null=after_null,
        )
    connections = runtime.connections
    try:
        pipeline = connections.ready() or await connections.get()
        if isinstance(query, sql.Composed):  # first request of this shape: render it once, with
            if len(queries) >= _MAX_SHAPES:  # the connection's quoting rules
                queries.clear()
            query = queries[shape] = query.as_bytes(pipeline.conn)
        rows = await pipeline.submit(query, args, _ADAPTERS, view.row)
    except Exception as exc:  # noqa: BLE001 - a bad value for a typed column is the caller's error
        from psycopg import errors

        if isinstance(exc, errors.DataError):
            raise HTTPException(
                422, f"a filter value does not fit its column's type: {exc.diag.message_primary or exc}"
            ) from None  # (no diag when the client refused it: a NUL byte, which text cannot hold)
        if isinstance(exc, errors.UndefinedTable):
            raise HTTPException(
                404, f"view {name!r} has not been built yet: run `tributary project run {name}`"
            ) from None
        if isinstance(exc, errors.OperationalError):  # lost or refused; the next request reconnects
            raise HTTPException(
                503, "the service database did not answer (connection lost or refused); retry"
            ) from None
        raise
    page = rows[:limit] if len(rows) > limit else rows
    next_cursor = _encode_cursor([page[-1][k] for k in keys]) if len(rows) > limit and page else None
    return orjson.dumps({"view": name, "rows": page, "next_cursor": next_cursor}, default=_default)


_LIMIT = re.compile(r"[1-9][0-9]{0,3}")


def _query_items(query: str) -> list[tuple[str, str]]:
    """`parse_qsl(query, keep_blank_values=True)` (what Starlette's QueryParams uses), splitting
    directly when nothing is escaped (a third of its cost)."""
    if "%" in query or "+" in query:
        return parse_qsl(query, keep_blank_values=True)
    return [(name, value) for name, _, value in (pair.partition("=") for pair in query.split("&") if pair)]


async def fast_page(state: Any, runtime: _Runtime, scope: Scope) -> bytes | None:
    """The body of a plain successful `GET /views/{name}`, computed without FastAPI's routing and
    dependency solving (most of a point lookup's CPU time); `None` hands the request to the route.

    Same code (`_page`), same auth check, same body as the route. Anything unusual (an error to
    report, a repeated or malformed parameter, a failed or missing key) is `None`, so every 4xx is the
    route's own (a GET has no body, so re-running it there is safe); unexpected errors propagate."""
    name = scope["path"][7:]
    if not name or "/" in name:
        return None
    try:
        if runtime.keys:
            _check_read(Request(scope))
        items = _query_items(scope["query_string"].decode("latin-1"))
        params = dict(items)
        if len(params) != len(items):
            return None  # a repeated parameter: let the route decide which one counts
        limit = params.get("limit")
        if limit is not None and not _LIMIT.fullmatch(limit):
            return None  # FastAPI's own int parsing (and its 422) is the reference
        return await _page(
            state,
            runtime,
            name,
            params,
            100 if limit is None else int(limit),
            params.get("cursor"),
            params.get("order_by"),
        )
    except HTTPException:  # every 4xx is the route's own: it re-runs the request
        return None
