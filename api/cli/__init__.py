"""The `tributary` command line (typer + rich), one module per command group."""
