"""Group listings (`tributary --help`, `tributary log --help`, …) that show each command's whole
first sentence, wrapped, instead of click's cut to the terminal's width (`… fails if it is not
running), e.g.`), which read as broken sentences."""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

__all__ = ["SentenceGroup", "first_sentence"]


def first_sentence(text: str) -> str:
    """The first sentence of a docstring's first paragraph, whitespace collapsed. A period ends it
    when the text ends or the next word does not start in lowercase (so `e.g. for` goes on)."""
    words = text.partition("\n\n")[0].split()
    for i, word in enumerate(words):
        if word.endswith(".") and (i == len(words) - 1 or not words[i + 1][:1].islower()):
            return " ".join(words[: i + 1])
    return " ".join(words)


class SentenceGroup(TyperGroup):
    """A typer group whose listing gives every command its whole first sentence."""

    # Any: typer carries its own copy of click, whose Context and HelpFormatter it does not export
    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, first_sentence(cmd.short_help or cmd.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
