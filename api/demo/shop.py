"""The demo's sample shop: a schema and a small workload that keeps writing to it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

__all__ = ["SHOP_SCHEMA", "Workload", "create_shop"]

SHOP_SCHEMA = """
CREATE TABLE IF NOT EXISTS customers (
    id bigserial PRIMARY KEY,
    email text NOT NULL UNIQUE,
    name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS products (
    id bigserial PRIMARY KEY,
    sku text NOT NULL UNIQUE,
    title text NOT NULL,
    price numeric(12, 2) NOT NULL CHECK (price >= 0),
    tags text[] NOT NULL DEFAULT '{}',
    attributes jsonb NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS orders (
    id bigserial PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers(id),
    status text NOT NULL DEFAULT 'new',
    placed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS order_items (
    order_id bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
    line int NOT NULL,
    product_id bigint NOT NULL REFERENCES products(id),
    quantity int NOT NULL CHECK (quantity > 0),
    unit_price numeric(12, 2) NOT NULL,
    PRIMARY KEY (order_id, line)
);
"""

_STATUSES = ("new", "paid", "shipped", "delivered", "cancelled")


def create_shop(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SHOP_SCHEMA)


@dataclass
class Workload:
    """Random but plausible shop traffic; `step()` runs one transaction and says what it did."""

    dsn: str
    seed: int = 7

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.conn: psycopg.Connection[Any] = psycopg.connect(self.dsn)
        self.counts = {"transactions": 0, "inserts": 0, "updates": 0, "deletes": 0}

    def seed_catalog(self, customers: int = 20, products: int = 10) -> None:
        with self.conn.transaction():
            for i in range(products):
                self.conn.execute(
                    "INSERT INTO products (sku, title, price, tags, attributes) VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT (sku) DO NOTHING",
                    (
                        f"SKU-{i:04d}",
                        f"Product {i}",
                        f"{self.rng.randint(100, 99999) / 100:.2f}",
                        ["demo", f"group{i % 3}"],
                        Jsonb({"color": self.rng.choice(["red", "blue"])}),
                    ),
                )
            for i in range(customers):
                self.conn.execute(
                    "INSERT INTO customers (email, name) VALUES (%s, %s) ON CONFLICT (email) DO NOTHING",
                    (f"customer{i}@example.com", f"Customer {i}"),
                )
        self.counts["inserts"] += customers + products
        self.counts["transactions"] += 1

    def step(self) -> None:
        """One transaction: place an order (most often), advance one, or re-price a product."""
        roll = self.rng.random()
        with self.conn.transaction():
            if roll < 0.6:
                self._place_order()
            elif roll < 0.9:
                self._advance_order()
            else:
                self.conn.execute(
                    "UPDATE products SET price = round((price * %s)::numeric, 2) WHERE id = "
                    "(SELECT id FROM products ORDER BY random() LIMIT 1)",
                    (self.rng.choice(("0.9", "1.1")),),
                )
                self.counts["updates"] += 1
        self.counts["transactions"] += 1

    def _place_order(self) -> None:
        row = self.conn.execute(
            "INSERT INTO orders (customer_id) SELECT id FROM customers ORDER BY random() LIMIT 1 RETURNING id"
        ).fetchone()
        if row is None:
            return
        lines = self.rng.randint(1, 3)
        for line in range(1, lines + 1):
            self.conn.execute(
                "INSERT INTO order_items (order_id, line, product_id, quantity, unit_price) "
                "SELECT %s, %s, id, %s, price FROM products ORDER BY random() LIMIT 1",
                (row[0], line, self.rng.randint(1, 5)),
            )
        self.counts["inserts"] += 1 + lines

    def _advance_order(self) -> None:
        row = self.conn.execute(
            "SELECT id, status FROM orders WHERE status NOT IN ('delivered', 'cancelled') ORDER BY random() LIMIT 1"
        ).fetchone()
        if row is None:
            return
        if row[1] == "new" and self.rng.random() < 0.2:
            self.conn.execute("DELETE FROM orders WHERE id = %s", (row[0],))  # cascades to its items
            self.counts["deletes"] += 1
            return
        nxt = _STATUSES[min(_STATUSES.index(row[1]) + 1, 3)]
        self.conn.execute("UPDATE orders SET status = %s WHERE id = %s", (nxt, row[0]))
        self.counts["updates"] += 1

    def close(self) -> None:
        self.conn.close()
