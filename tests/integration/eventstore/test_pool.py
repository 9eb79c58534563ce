"""WarmFirstPool's fast getconn/putconn against a real PostgreSQL: every case the stock pool
handles (a waiting client, a connection in a transaction, broken or expired, a closed pool)
still ends as the stock pool would end it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolClosed

from tributary.eventstore.store import WarmFirstPool

pytestmark = pytest.mark.integration


@pytest.fixture
def pool(fresh_db: str) -> Iterator[WarmFirstPool]:
    p = WarmFirstPool(fresh_db, min_size=2, max_size=2, open=True, kwargs={"autocommit": True})
    p.wait(timeout=30)
    try:
        yield p
    finally:
        p.close()


def _pid(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]


def test_the_last_returned_connection_is_handed_out_first(pool: WarmFirstPool) -> None:
    a, b = pool.getconn(), pool.getconn()
    pid_b = _pid(b)
    pool.putconn(a)
    pool.putconn(b)
    for _ in range(3):
        c = pool.getconn()
        assert _pid(c) == pid_b
        pool.putconn(c)
    assert pool.get_stats()["requests_num"] == 5 and pool.get_stats()["pool_available"] == 2


def test_a_connection_returned_in_a_transaction_is_rolled_back(pool: WarmFirstPool) -> None:
    conn = pool.getconn()
    conn.execute("CREATE TABLE t (x int)")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES (1)")
    pool.putconn(conn)
    again = pool.getconn()
    assert again.pgconn.transaction_status == TransactionStatus.IDLE
    assert again.execute("SELECT count(*) FROM t").fetchone() == (0,)
    pool.putconn(again)


def test_a_broken_connection_is_replaced(pool: WarmFirstPool) -> None:
    a, b = pool.getconn(), pool.getconn()
    dead = _pid(a)
    b.execute("SELECT pg_terminate_backend(%s)", (dead,))
    with pytest.raises(psycopg.OperationalError):
        a.execute("SELECT 1")
    pool.putconn(a)
    pool.putconn(b)
    pids = set()
    for _ in range(2):
        conns = [pool.getconn(timeout=10) for _ in range(2)]
        pids |= {_pid(c) for c in conns}
        for c in conns:
            pool.putconn(c)
    assert dead not in pids and len(pids) == 2


def test_an_expired_connection_is_replaced(fresh_db: str) -> None:
    with WarmFirstPool(
        fresh_db, min_size=1, max_size=1, max_lifetime=0.5, open=False, kwargs={"autocommit": True}
    ) as p:
        conn = p.getconn()
        old = _pid(conn)
        time.sleep(0.6)
        p.putconn(conn)
        fresh = p.getconn(timeout=10)
        assert _pid(fresh) != old
        p.putconn(fresh)


def test_a_returned_connection_goes_to_the_client_waiting_for_it(pool: WarmFirstPool) -> None:
    held = [pool.getconn(), pool.getconn()]
    got: list[int] = []

    def waiter() -> None:
        c = pool.getconn(timeout=10)
        got.append(_pid(c))
        pool.putconn(c)

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 10
    while not pool.get_stats().get("requests_queued") and time.monotonic() < deadline:
        time.sleep(0.01)
    pid = _pid(held[0])
    pool.putconn(held[0])
    t.join(timeout=10)
    assert got == [pid]
    pool.putconn(held[1])


def test_a_closed_pool_refuses_and_closes_what_comes_back(fresh_db: str) -> None:
    p = WarmFirstPool(fresh_db, min_size=1, max_size=1, open=True, kwargs={"autocommit": True})
    p.wait(timeout=30)
    conn = p.getconn()
    p.close()
    p.putconn(conn)
    assert conn.closed
    with pytest.raises(PoolClosed):
        p.getconn()
