"""`GET /views` and `GET /views/{name}`: query derived tables with declared-column filters.

Filters only on the projection's declared columns, values always bound as parameters and cast to
the declared type; keyset pagination over (order column, primary key) with an opaque cursor.

A view page is the API's hottest read: `VIEW_ROUTE` serves it ahead of the app's routes as a plain
Starlette route (`app.HOT_ROUTES`), with the answers of FastAPI's route, which stays in `router` for
the OpenAPI document (whose methods the 405 of another method lists). That route declares no parameter FastAPI must
solve (the endpoint reads the query, checks the key and validates `limit` itself), so all FastAPI's
request handling added was its per-request machinery: ≈ a quarter of a point lookup's Python calls.
"""

from __future__ import annotations

import asyncio
import base64
import decimal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from psycopg import errors, sql
from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import State

from tributary.api.http.auth import AUTH_RESPONSES, error, require
from tributary.api.http.definitions import current_projections
from tributary.api.http.front import TemplateRoute
from tributary.api.http.problems import Problem
from tributary.api.http.state import AppState, Pool, app_state, views_of
from tributary.api.http.views_db import CONNECTION_WAIT_S, PREPARE_THRESHOLD, StatementTimeout, ViewColumns, Views
from tributary.jsonvalue import JsonValue

if TYPE_CHECKING:  # imported with the definitions they describe (`definitions.current_projections`)
    from tributary.projections.definition import Projection

__all__ = ["CONNECTION_WAIT_S", "PREPARE_THRESHOLD", "VIEW_ROUTE", "StatementTimeout", "Views", "router"]

router = APIRouter(tags=["views"], responses=AUTH_RESPONSES)
# The read scope: a dependency of `GET /views`; `GET /views/{name}`, the hot route, awaits it itself
# (FastAPI's solving of a dependency costs more CPU than the check).
_read = require("read")

MAX_LIMIT = 1000
_OPS = {"eq": "=", "ne": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}  # `col__op=v`; plain `col=v` is eq
_RESERVED = {"limit", "cursor", "order_by"}


def _projections(state: State) -> dict[str, Projection]:
    """The configured projections as the config and projection files say now (`serve` follows
    edits without a restart); unchanged files cost a `stat` each."""
    return current_projections(state)


def _default(obj: object) -> str:
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    raise TypeError


def _json(body: JsonValue) -> Response:
    return Response(orjson.dumps(body, default=_default), media_type="application/json")


@router.get("/views", dependencies=[Depends(_read)])
async def list_views(state: AppState, pool: Pool) -> Response:
    """Each view: name, columns with types, primary key, projection version, serving build."""
    projections = await asyncio.to_thread(_projections, state)
    builds: dict[str, Any] = {}
    try:
        async with pool.connection() as conn:
            try:
                cur = await conn.execute(
                    "SELECT projection, build, version, table_name, finished_at "
                    "FROM tributary_projections.builds WHERE current"
                )
                builds = {r[0]: r for r in await cur.fetchall()}
            except errors.UndefinedTable:  # no projection has run yet: the builds table is missing
                builds = {}
    except errors.OperationalError:  # timed out, lost or refused: not "nothing built"
        raise Problem(
            503, "unavailable", "the service database did not answer (timed out, lost or refused); retry"
        ) from None
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
        raise Problem(
            422,
            "invalid_query",
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
        raise Problem(422, "invalid_query", "cursor is not one this API returned") from None
    if (
        not isinstance(values, list)
        or len(values) != width
        or not all(v is None or (isinstance(v, str | int | float) and not isinstance(v, bool)) for v in values)
    ):
        raise Problem(422, "invalid_query", "cursor is not one this API returned")
    return values


def _columns(names: list[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(k) for k in names)


def _casts(names: list[str], types: dict[str, str]) -> sql.Composed:
    """One placeholder per name, cast to the column's declared type."""
    return sql.SQL(", ").join(sql.SQL("CAST({} AS {})").format(sql.Placeholder(), sql.SQL(types[k])) for k in names)


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
    """The page query; its placeholders take the filter values, then the cursor's (in that order)."""
    where: list[sql.Composable] = [
        sql.SQL("{} {} CAST({} AS {})").format(
            sql.Identifier(column), sql.SQL(op), sql.Placeholder(), sql.SQL(types[column])
        )
        for column, op in filters
    ]
    if after:
        op = sql.SQL("<" if descending else ">")
        row = _columns(keys)
        # the cursor's values follow the filters' (with no order value when it is NULL: not sent)
        cursor = _casts(keys[1:] if after_null else keys, types)
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


# The page parameters, as FastAPI would document them were they declared in the signature
# (`limit: int = 100, cursor: str | None = None, order_by: str | None = None`). The route reads them
# itself: FastAPI's per-request parameter solving costs more CPU than the query's whole client side.
_OPTIONAL_TEXT = {"anyOf": [{"type": "string"}, {"type": "null"}]}
_PAGE_PARAMETERS = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "default": 100, "title": "Limit"},
    },
    {"name": "cursor", "in": "query", "required": False, "schema": {**_OPTIONAL_TEXT, "title": "Cursor"}},
    {"name": "order_by", "in": "query", "required": False, "schema": {**_OPTIONAL_TEXT, "title": "Order By"}},
]
_INT = TypeAdapter(int)


def _limit(params: Mapping[str, str]) -> int:
    """`limit` (default 100) read as FastAPI reads a declared `limit: int` query parameter, with its
    422 body when it is not an integer (pydantic's lax parsing and error)."""
    raw = params.get("limit")
    if raw is None:
        return 100
    try:
        return _INT.validate_python(raw)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("query", "limit", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


@router.get(
    "/views/{name}",
    responses={
        404: error("no such view, or not built yet"),
        422: error("unknown column or operator, bad value, limit or cursor"),
        503: error("starting up, or the service database did not answer"),
    },
    openapi_extra={"parameters": _PAGE_PARAMETERS},
)
async def query_view(name: str, request: Request) -> Response:
    """Rows of `views.<name>`: `?col=v`, `?col__gte=v` (eq ne gt gte lt lte), `order_by=col|-col`,
    `limit` (≤ 1000), `cursor` from the previous page's `next_cursor`."""
    await _read(request)
    # The app's state through its typed accessors, not `Depends`: the hot route (see `state`).
    state, views = await app_state(request), await views_of(request)
    params = request.query_params
    limit = _limit(params)
    if views is None:
        raise Problem(503, "unavailable", "starting up: the database pool is not open yet")
    body = await _page(state, views, name, params, limit, params.get("cursor"), params.get("order_by"))
    return Response(body, media_type="application/json")


async def _view_endpoint(request: Request) -> Response:
    """`GET /views/{name}` without FastAPI's request handling: the documented route's endpoint, which
    takes nothing FastAPI validates (`name` is any path segment), so its answers are the same."""
    return await query_view(request.path_params["name"], request)


VIEW_ROUTE = TemplateRoute("/views/{name}", _view_endpoint, methods=["GET"], include_in_schema=False)


def _view(state: State, views: Views, name: str) -> ViewColumns | None:
    """A view's columns, derived again when its projection's definition changed (an edited file)."""
    p = _projections(state).get(name)
    if p is None:
        views.meta.pop(name, None)
        return None
    view = views.meta.get(name)
    if view is None or views.sources.get(name) is not p:
        view = views.meta[name] = ViewColumns({c.name: c.type for c in p.table.columns}, tuple(p.table.primary_key))
        if name in views.sources:  # the columns may differ: the SQL texts composed for the old ones must go
            views.queries.clear()
        views.sources[name] = p
    return view


async def _page(
    state: State,
    views: Views,
    name: str,
    params: Mapping[str, str],
    limit: int,
    cursor: str | None,
    order_by: str | None,
) -> bytes:
    """The JSON body of one page of a view."""
    view = _view(state, views, name)
    if view is None:
        raise Problem(404, "unknown_view", f"no view named {name!r}; GET /views lists them")
    types, primary_key = view.types, view.primary_key
    filters = _parse_filters(params, types)
    if not 1 <= limit <= MAX_LIMIT:
        raise Problem(422, "invalid_query", f"limit must be between 1 and {MAX_LIMIT}")
    descending = bool(order_by and order_by.startswith("-"))
    order_col = (order_by[1:] if descending else order_by) if order_by else None  # one `-` at most
    if order_col is not None and order_col not in types:
        raise Problem(422, "invalid_query", f"cannot order by unknown column {order_col!r}")
    keys = ([order_col] if order_col and order_col not in primary_key else []) + list(primary_key)
    if order_col in primary_key:
        keys = [order_col] + [k for k in primary_key if k != order_col]

    # Every value goes as text, cast by the query to the column's declared type.
    args: list[str | None] = [value for _, _, value in filters]
    nullable = keys[0] not in primary_key
    after_null = False
    if cursor:
        values = _decode_cursor(cursor, len(keys))
        after_null = nullable and values[0] is None
        args.extend(None if v is None else str(v) for v in (values[1:] if after_null else values))
    shape = (name, tuple([(c, op) for c, op, _ in filters]), tuple(keys), descending, bool(cursor), after_null, limit)
    query = views.queries.get(shape) or _compose(
        views.schema,
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
    try:
        rows = await views.fetch(shape, query, args)
    except errors.DataError as exc:  # a bad value for a typed column is the caller's error
        raise Problem(
            422, "invalid_query", f"a filter value does not fit its column's type: {exc.diag.message_primary or exc}"
        ) from None  # (no diag when psycopg refused it: a NUL byte, which text cannot hold)
    except errors.UndefinedTable:
        raise Problem(
            404, "view_not_built", f"view {name!r} has not been built yet: run `tributary project run {name}`"
        ) from None
    except StatementTimeout:
        raise Problem(
            503,
            "unavailable",
            f"the query ran longer than the server allows ([api] statement_timeout_ms = {views.statement_timeout_ms}); "
            "narrow the filters or order by an indexed column",
        ) from None
    except errors.OperationalError:  # lost or refused (`Views.fetch` has the pool checked); retry
        raise Problem(
            503, "unavailable", "the service database did not answer (connection lost or refused); retry"
        ) from None
    page = rows[:limit] if len(rows) > limit else rows
    next_cursor = _encode_cursor([page[-1][k] for k in keys]) if len(rows) > limit and page else None
    return orjson.dumps({"view": name, "rows": page, "next_cursor": next_cursor}, default=_default)
