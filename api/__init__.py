"""The outer layer: HTTP API (`http`), command line (`cli`), configuration (`settings`),
the embedded PostgreSQL (`devdb`) and the demo (`demo`). `http` and `settings` never import `cli`."""
