"""View queries sent through a few connections in libpq's pipeline mode, answered in order.

A point lookup costs PostgreSQL ≈ 20 µs of work and as much again to be woken for it: a backend that
sleeps between queries pays a wake-up, a `recv` and cold caches per query (one connection at a time,
measured on this machine: 50 µs of backend CPU per query; 30 µs when four queries arrive together,
22 µs for eight). Here each query is sent the moment its request asks (no waiting for company:
Parse when new, Bind/Execute, then a Sync that makes it its own implicit transaction), so the
queries of concurrent requests queue in the backend's socket and it runs them back to back; their
results come back in the order sent and each request's future gets its own rows or error.

Per connection, a FIFO of jobs; the socket stays registered with the event loop while any job is
in flight, and results are read and loaded in the reader callback. An error ends only its own job
(each job ends with its own Sync). A cancelled request's results are read and dropped, so the
connection stays usable. A lost connection fails every job in flight with psycopg's error and is
replaced on the next query. A table swapped by a rebuild for one of other column types makes
PostgreSQL refuse the old plan: the statement is deallocated and prepared again, once.

Used by the views' read path only: these connections never run anything else.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from psycopg import AsyncConnection, errors, pq
from psycopg.adapt import AdaptersMap

from tributary.api.http import pg_prepared

__all__ = ["Pipelines"]

Row = TypeVar("Row")
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_ABORTED = pq.ExecStatus.PIPELINE_ABORTED
_SQLSTATE = pq.DiagnosticField.SQLSTATE
_STALE_PLAN = b"0A000"  # feature_not_supported: "cached plan must not change result type"
_NO_STATEMENT = b"26000"  # invalid_sql_statement_name: "prepared statement … does not exist"
_WATCH_S = 1.0  # how often a connection with jobs in flight is read without being told (see `_watch`)


class _Job(Generic[Row]):
    """One request's query: its future, what it sent (to send it again after a stale plan), and the
    results read so far (one per command before its Sync)."""

    __slots__ = ("future", "make_row", "name", "query", "results", "retried", "sent_at", "state", "values")

    def __init__(
        self,
        future: asyncio.Future[list[Row]],
        state: pg_prepared.State,
        name: bytes,
        query: bytes,
        values: list[bytes | None],
        make_row: Callable[[Sequence[Any]], Row],
    ) -> None:
        self.future = future
        self.state = state
        self.name = name
        self.query = query
        self.values = values
        self.make_row = make_row
        self.results: list[pq.abc.PGresult] = []
        self.retried = False
        self.sent_at = 0.0


class _Pipeline:
    """One connection in pipeline mode and its jobs in flight, oldest first."""

    def __init__(self, conn: AsyncConnection[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.pgconn = pgconn = conn.pgconn
        self.loop = loop
        self.jobs: collections.deque[_Job[Any]] = collections.deque()
        self.broken: Exception | None = None
        self._writing = False
        self._watch: asyncio.TimerHandle | None = None
        pgconn.nonblocking = 1
        pgconn.enter_pipeline_mode()
        self.fd = pgconn.socket
        loop.add_reader(self.fd, self._readable)

    def submit(
        self,
        query: bytes,
        params: Sequence[Any],
        adapters: AdaptersMap,
        make_row: Callable[[Sequence[Any]], Row],
    ) -> asyncio.Future[list[Row]]:
        """Send `query` now; the future gets its rows (each built by `make_row`) or its error."""
        if self.broken is not None:
            raise self.broken
        state = pg_prepared.state(self.conn, adapters)
        values = pg_prepared.encode_params(params, state.encoding)  # NUL refused before anything is sent
        future: asyncio.Future[list[Row]] = self.loop.create_future()
        job = _Job(future, state, pg_prepared.statement_name(query), query, values, make_row)
        self._send(job)
        return future

    def _send(self, job: _Job[Any], *, again: bool = False) -> None:
        pgconn, state = self.pgconn, job.state
        try:
            if again:  # the old plan was refused: forget it and prepare the text anew
                pgconn.send_query_params(b"DEALLOCATE " + job.name, None)
            if job.name not in state.prepared:
                if len(state.prepared) >= pg_prepared.MAX_PREPARED:
                    job.name = b""  # the unnamed statement: parsed per run
                pgconn.send_prepare(job.name, job.query)
                if job.name:
                    state.prepared.add(job.name)  # a failed Parse takes it back (`_finish`)
            pgconn.send_query_prepared(job.name, job.values)
            pgconn.pipeline_sync()
        except Exception as exc:  # noqa: BLE001 - libpq refused to queue: the connection is unusable
            self._fail(exc)
            if not job.future.done():
                job.future.set_exception(self.broken or exc)
            return
        job.sent_at = self.loop.time()
        self.jobs.append(job)
        self._flush()
        if self._watch is None:
            self._watch = self.loop.call_later(_WATCH_S, self._watchdog)

    def _flush(self) -> None:
        try:
            pending = self.pgconn.flush()
        except Exception as exc:  # noqa: BLE001 - the socket is gone
            self._fail(exc)
            return
        if pending and not self._writing:
            self.loop.add_writer(self.fd, self._flush)
            self._writing = True
        elif not pending and self._writing:
            self.loop.remove_writer(self.fd)
            self._writing = False

    def _readable(self) -> None:
        pgconn = self.pgconn
        try:
            pgconn.consume_input()
            jobs = self.jobs
            while jobs and not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    continue  # the end of one command's results
                if result.status == _SYNC:
                    self._finish(jobs.popleft())
                else:
                    jobs[0].results.append(result)
        except Exception as exc:  # noqa: BLE001 - a lost connection: every job in flight fails with it
            self._fail(exc)

    def _finish(self, job: _Job[Any]) -> None:
        """The job's Sync arrived: hand its rows or its first error to its future."""
        results, state = job.results, job.state
        failed = next((r for r in results if r.status not in (_TUPLES_OK, _COMMAND_OK)), None)
        if failed is not None and failed.status != _ABORTED:
            if job.name and failed is not results[-1]:
                state.prepared.discard(job.name)  # its Parse (or DEALLOCATE) failed: nothing prepared
            sqlstate = failed.error_field(_SQLSTATE)
            if job.name and not job.retried and sqlstate in (_STALE_PLAN, _NO_STATEMENT):
                # a stale plan: deallocate and prepare again; no statement: a concurrent job's Parse
                # failed after this one was sent without its own (the name was taken back since)
                job.retried, job.results = True, []
                state.prepared.discard(job.name)
                self._send(job, again=sqlstate == _STALE_PLAN)
                return
        if job.future.done():
            return  # cancelled meanwhile: its results are read, nobody wants them
        if failed is not None:
            job.future.set_exception(errors.error_from_result(failed, encoding=state.encoding))
            return
        result = results[-1]
        if result.status != _TUPLES_OK:
            job.future.set_exception(errors.error_from_result(result, encoding=state.encoding))
            return
        tx = state.transformer
        tx.set_pgresult(result)
        try:
            job.future.set_result(tx.load_rows(0, result.ntuples, job.make_row))
        except Exception as exc:  # noqa: BLE001 - a value its loader refused: this request's error
            job.future.set_exception(exc)
        finally:
            tx.set_pgresult(None)

    def _watchdog(self) -> None:
        """While jobs are in flight, read once a second without being told: uvloop drops a socket's
        registration on an error without calling back, and a lost connection must still fail its jobs."""
        self._watch = None
        if self.broken is not None or not self.jobs:
            return
        if self.pgconn.socket != self.fd:
            self._fail(errors.OperationalError("the connection to the service database was lost"))
            return
        self.loop.remove_reader(self.fd)
        self.loop.add_reader(self.fd, self._readable)
        self._readable()
        if self.broken is None and self.jobs:
            self._watch = self.loop.call_later(_WATCH_S, self._watchdog)

    def _fail(self, exc: Exception) -> None:
        if self.broken is None:
            self.broken = exc if isinstance(exc, errors.Error) else errors.OperationalError(str(exc))
        self._unregister()
        jobs, self.jobs = self.jobs, collections.deque()
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(self.broken)

    def _unregister(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self.loop.remove_reader(self.fd)
        if self._writing:
            self.loop.remove_writer(self.fd)
            self._writing = False

    async def close(self) -> None:
        self._fail(errors.OperationalError("the view connection was closed"))
        await self.conn.close()


class Pipelines:
    """Pipelined connections to `dsn`, opened on first use. Queries go to the first connection
    whose oldest query in flight is younger than `STALL_S` (usually the first: one backend then runs
    the queries of all concurrent requests back to back); a slow query makes the next requests go
    to the next connection, opening one while fewer than `size` are open, so it delays at most the
    queries sent in the `STALL_S` after it."""

    STALL_S = 0.05

    def __init__(self, dsn: str, *, size: int = 4) -> None:
        self._dsn = dsn
        self._size = size
        self._open: list[_Pipeline] = []
        self._opening: asyncio.Task[_Pipeline] | None = None
        self._closed = False

    def ready(self) -> _Pipeline | None:
        """A connection to send on now, or `None`: `await get()` one."""
        now = -1.0
        for pipeline in self._open:
            if pipeline.broken is None:
                jobs = pipeline.jobs
                if not jobs:
                    return pipeline
                if now < 0:
                    now = pipeline.loop.time()
                if now - jobs[0].sent_at < self.STALL_S:
                    return pipeline
        return None

    async def get(self) -> _Pipeline:
        """A connection to send on: as `ready`, else a new one while fewer than `size` are open
        (lost ones replaced), else the one whose oldest query in flight is the youngest."""
        if self._closed:
            raise errors.OperationalError("the view connections are closed")
        self._open = [p for p in self._open if p.broken is None]
        got = self.ready()
        if got is not None:
            return got
        if len(self._open) >= self._size:
            return max(self._open, key=lambda p: p.jobs[0].sent_at if p.jobs else float("inf"))
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect())
        opening = self._opening
        try:
            return await asyncio.shield(opening)
        finally:
            if self._opening is opening and opening.done():
                self._opening = None

    async def _connect(self) -> _Pipeline:
        conn = await AsyncConnection.connect(self._dsn, autocommit=True)
        pipeline = _Pipeline(conn, asyncio.get_running_loop())
        if self._closed:
            await pipeline.close()
            raise errors.OperationalError("the view connections are closed")
        self._open.append(pipeline)
        return pipeline

    async def fetch(
        self,
        query: bytes,
        params: Sequence[Any],
        adapters: AdaptersMap,
        make_row: Callable[[Sequence[Any]], Row],
    ) -> list[Row]:
        """The rows of `query` (SQL with `$1`… placeholders, typed by casts) for `params`."""
        pipeline = self.ready() or await self.get()
        return await pipeline.submit(query, params, adapters, make_row)

    async def __aenter__(self) -> Pipelines:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._opening is not None:
            self._opening.cancel()
        live, self._open = self._open, []
        for pipeline in live:
            await pipeline.close()
