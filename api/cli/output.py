"""How the CLI writes through rich: one console set-up, and user text that is never read as markup.

Rich reads `[word]` as a style tag and drops it, so `[service] dsn` in a message would print as
` dsn`: every piece of user text (messages, names, errors) goes through `literal` before it meets
markup of ours. Rich also wraps at the terminal's width, or at 80 columns when the output is a pipe:
our consoles soft-wrap, so a long line reaches a pipe or a file whole.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

__all__ = ["console", "count", "is_terminal", "literal"]


def console(*, stderr: bool = False) -> Console:
    """A console that never hard-wraps (a terminal wraps by itself, a pipe gets whole lines)."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def literal(text: object) -> str:
    """`text` escaped for rich markup, so brackets in it print as they are."""
    return escape(str(text))


def is_terminal() -> bool:
    """Both stdout and stderr are terminals: only then may a command draw a live display."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def count(n: int, noun: str) -> str:
    """`1 row`, `2 rows`, `1,000 rows`: a number and its noun, singular or plural as it agrees."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
