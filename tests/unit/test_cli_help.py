"""Every group's `--help` lists its commands with whole sentences: never cut mid-sentence (`…`),
never ended at an abbreviation (`…, e.g.`), at the width a plain terminal or a pipe gets."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tributary.api.cli.main import app

pytestmark = pytest.mark.unit

_ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "cf.")


def _groups(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The command path of every group under `group` (a command with subcommands), itself included."""
    found = [path]
    for name, cmd in getattr(group, "commands", {}).items():
        if hasattr(cmd, "commands"):
            found += _groups(cmd, (*path, name))
    return found


def _listing(help_text: str) -> dict[str, str]:
    """The Commands section of a help page: name → description (wrapped lines joined)."""
    section = help_text.split("\nCommands:\n", 1)[1]
    entries: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        if not line.strip():
            break
        m = re.match(r"^  (\S+)\s+(.*)$", line)
        if m:
            name = m.group(1)
            entries[name] = m.group(2).strip()
        else:
            entries[name] += " " + line.strip()
    return entries


def test_every_group_lists_whole_sentences() -> None:
    paths = _groups(typer.main.get_command(app))
    assert {("pg",), ("log",), ("capture",), ("project",), ("groups",), ("sinks",), ("config",)} <= set(paths)
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
        assert result.exit_code == 0, result.output
        listed = _listing(result.stdout)
        assert listed, (path, result.stdout)
        for name, text in listed.items():
            where = f"tributary {' '.join((*path, name))}: {text!r}"
            assert text[:1].isupper(), where
            assert text.endswith(".") and not text.endswith("..."), where
            assert not text.endswith(_ABBREVIATIONS), where
