-- Runs once, on the first start of an empty data directory (the image's entrypoint runs it with
-- psql as the superuser). Creates the two roles tributary connects as — neither a superuser —
-- the service database and a sample source database `shop`. Their passwords are the compose
-- secrets (files under /run/secrets, made by deploy/secrets/generate.sh), read by psql here.
\set service_password `cat /run/secrets/service_password`
\set capture_password `cat /run/secrets/capture_password`

-- The service role (`[service] dsn`: init, the API, capture's and the projections' bookkeeping):
-- owner of the service database, where `tributary init` creates its schemas and tables; it may
-- replicate because capture follows the event store's own table in that database (`_eventstore`).
CREATE ROLE tributary_service LOGIN REPLICATION PASSWORD :'service_password';
-- The capture role (the source's `dsn`): streams the source's changes (REPLICATION) and reads its
-- tables for snapshots (SELECT, granted below); it writes nothing there.
CREATE ROLE tributary_capture LOGIN REPLICATION PASSWORD :'capture_password';

-- The service database: event store, checkpoints, consumer groups, views.
CREATE DATABASE tributary OWNER tributary_service;
REVOKE ALL ON DATABASE tributary FROM PUBLIC;

-- The sample source that capture follows (`[[sources]] name = "shop"`).
CREATE DATABASE shop;
REVOKE ALL ON DATABASE shop FROM PUBLIC;
GRANT CONNECT ON DATABASE shop TO tributary_capture;

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

-- Capture reads every table of the source, those created later too.
GRANT USAGE ON SCHEMA public TO tributary_capture;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO tributary_capture;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO tributary_capture;
