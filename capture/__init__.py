"""tributary.capture: PostgreSQL's logical replication (wal2json v2) into the log, by phase.

Each sub-package imports only those listed before it (tests/unit/test_layout.py checks it):

* `decoding/` — what the source sends, as values; pure, imports nothing else of capture:
  `wal2json` (messages → dataclasses), `values` (column text → the envelope's JSON),
  `lsn` (WAL positions), `encodings` (a database's encoding → UTF-8).
* `records/` — what capture emits: `envelope` (Debezium-style keys and envelopes), `routing`
  (tables → topics), `schema_tracker` (schema records), `outbox` (the event store's rows →
  events), `service_outbox` (rows of your services' outbox tables → events), `staging` (records
  on their way into the log, per partition), `debezium` (records rewritten as Debezium's JSON with
  schemas, for `envelope = "debezium"`), `rules` (per-table column and row rules) over `row_filter`
  (their filter expressions), and the opt-in side topics: `transactions` (BEGIN/END and each
  change's `transaction` block), `heartbeats`, `notifications` (a snapshot's start, tables and end).
* `database/` — the source database: `catalog` (tables, keys, replica identity, read from
  pg_catalog), `source_tables` (what capture follows of them while it runs), `replication` (the
  COPY_BOTH connection), `slot`, `session_guard`.
* `snapshot/` — `initial` (the initial snapshot as records) over `reader` (one table read inside
  an exported snapshot), `columnar` (its fast path, per column), `chunked` (incremental snapshots
  beside the stream), `signals` (the requests for them that arrive through the WAL).
* `streaming/` — `stream` (the slot's messages → staged records, transaction by transaction),
  `insert_template` and `template_cache` (the INSERT fast path), `ddl_watch` (schema changes in
  stream order), `positions` (which LSN is appended, durable, safe to confirm).

The modules here hold one captured database together and run them all: `source` (one database:
slot, snapshot, stream), `daemon` (every source into one log), `resume` (after a rebuilt
manifest), `prerequisites` (`tributary init`'s checks), with `spec` (a source as configured),
`status`, `errors`, and `compiled` (the Cython twins in `_hotpath.pyx`, or None).
"""
