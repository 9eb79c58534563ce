-- Runs once, on the first start of an empty data directory (the image's entrypoint runs it with
-- psql as the superuser). Creates the service database and a sample source database `shop`.

-- The service database: event store, checkpoints, consumer groups, views (`tributary init`
-- creates its tables).
CREATE DATABASE tributary;

-- The sample source that capture follows (`[[sources]] name = "shop"`).
CREATE DATABASE shop;

\connect shop

CREATE TABLE customers (
    id    serial PRIMARY KEY,
    name  text NOT NULL UNIQUE,
    email text NOT NULL
);

CREATE TABLE orders (
    id         serial PRIMARY KEY,
    customer   text NOT NULL,
    total      numeric(10, 2) NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO customers (name, email) VALUES
    ('ada', 'ada@example.com'),
    ('grace', 'grace@example.com'),
    ('edsger', 'edsger@example.com');

INSERT INTO orders (customer, total) VALUES
    ('ada', 12.50),
    ('grace', 99.00),
    ('edsger', 7.25);
