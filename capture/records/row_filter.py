"""Row filters: a small expression language over a record's row, compiled to a predicate. Pure.

    status = 'open' and (amount >= 100 or region in ('eu', 'uk')) and deleted_at is null

A filter names columns (bare `snake_case` or "double quoted"), compares them with literals
(numbers, 'text' with '' for a quote, true, false, null) by `=`, `!=`/`<>`, `<`, `<=`, `>`,
`>=`, `in (…)`, `not in (…)`, `is null`, `is not null`, and combines comparisons with `and`,
`or`, `not` and parentheses. Keywords are case-insensitive.

It is evaluated in Python on the values a record carries (docs/envelope.md): the same rules for
snapshot rows and streamed changes, so a row is in or out of the filter wherever it is read.
As in SQL, a comparison with a null is unknown, and a row is kept only when the filter is true.
A number literal compared with a text value (a numeric column's record value) compares numbers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["RowFilter", "compile_filter"]

Row = dict[str, Any]
Truth = bool | None  # SQL's three-valued logic: None is unknown
_Eval = Callable[[Row], Truth]

_TOKEN = re.compile(
    r"\s*(?:(?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)|(?P<str>'(?:[^']|'')*')|(?P<qid>\"(?:[^\"]|\"\")+\")"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<op><=|>=|<>|!=|=|<|>)|(?P<punct>[(),]))"
)
_KEYWORDS = frozenset(("and", "or", "not", "in", "is", "null", "true", "false"))
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: bool(a == b),
    "!=": lambda a, b: bool(a != b),
    "<>": lambda a, b: bool(a != b),
    "<": lambda a, b: bool(a < b),
    "<=": lambda a, b: bool(a <= b),
    ">": lambda a, b: bool(a > b),
    ">=": lambda a, b: bool(a >= b),
}


class RowFilter:
    """A compiled filter: `keeps(row)` is True when the row is in it; `columns` are those it reads."""

    def __init__(self, text: str, evaluate: _Eval, columns: frozenset[str]) -> None:
        self.text = text
        self.columns = columns
        self._evaluate = evaluate

    def keeps(self, row: Row) -> bool:
        return self._evaluate(row) is True

    def __repr__(self) -> str:
        return f"RowFilter({self.text!r})"


def compile_filter(text: str) -> RowFilter:
    """Parse `text` into a RowFilter; ValueError (one line, naming the place) when it is not one."""
    parser = _Parser(_tokens(text))
    evaluate = parser.expression()
    if parser.peek() is not None:
        raise ValueError(f"unexpected {parser.peek()[1]!r} in the row filter")  # type: ignore[index]
    return RowFilter(text, evaluate, frozenset(parser.columns))


def _tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) tokens: num, str, id (a column), kw (a keyword), op, punct."""
    out: list[tuple[str, str]] = []
    at = 0
    while text[at:].strip():
        m = _TOKEN.match(text, at)
        if m is None or m.end() == at:
            raise ValueError(f"cannot read the row filter at {text[at:].strip()[:20]!r}")
        at = m.end()
        kind = m.lastgroup
        assert kind is not None
        value = m.group(kind)
        if kind == "word":
            kind, value = ("kw", value.lower()) if value.lower() in _KEYWORDS else ("id", value)
        elif kind == "qid":
            kind, value = "id", value[1:-1].replace('""', '"')
        out.append((kind, value))
    if not out:
        raise ValueError("the row filter is empty")
    return out


class _Parser:
    """Recursive descent: or → and → not → comparison; each rule returns an evaluator."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.at = 0
        self.columns: set[str] = set()

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            want = value or {"id": "a column", "punct": "a bracket", "op": "an operator"}.get(kind, kind)
            got = "the end" if token is None else repr(token[1])
            raise ValueError(f"expected {want} in the row filter, found {got}")
        self.at += 1
        return token[1]

    def accept(self, kind: str, value: str) -> bool:
        if self.peek() == (kind, value):
            self.at += 1
            return True
        return False

    def expression(self) -> _Eval:
        terms = [self.conjunction()]
        while self.accept("kw", "or"):
            terms.append(self.conjunction())
        return terms[0] if len(terms) == 1 else _any(terms)

    def conjunction(self) -> _Eval:
        terms = [self.negation()]
        while self.accept("kw", "and"):
            terms.append(self.negation())
        return terms[0] if len(terms) == 1 else _all(terms)

    def negation(self) -> _Eval:
        if self.accept("kw", "not"):
            inner = self.negation()
            return lambda row: None if (v := inner(row)) is None else not v
        return self.comparison()

    def comparison(self) -> _Eval:
        if self.accept("punct", "("):
            inner = self.expression()
            self.take("punct", ")")
            return inner
        column = self.take("id")
        self.columns.add(column)
        if self.accept("kw", "is"):
            negated = self.accept("kw", "not")
            self.take("kw", "null")
            return lambda row: (row.get(column) is None) != negated
        negated = self.accept("kw", "not")
        if negated or self.peek() == ("kw", "in"):
            self.take("kw", "in")
            self.take("punct", "(")
            items = [self.literal()]
            while self.accept("punct", ","):
                items.append(self.literal())
            self.take("punct", ")")
            return _member(column, items, negated)
        op = self.take("op")
        return _compare(column, _COMPARE[op], self.literal())

    def literal(self) -> Any:
        token = self.peek()
        if token is None:
            raise ValueError("expected a value in the row filter, found the end")
        self.at += 1
        kind, text = token
        if kind == "num":
            return Decimal(text) if "." in text or "e" in text.lower() else int(text)
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "kw" and text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        raise ValueError(f"expected a value in the row filter, found {text!r}")


def _comparable(value: Any, literal: Any) -> Any:
    """The row's value as the literal's kind: a numeric column's text against a number is a number."""
    if isinstance(literal, int | Decimal) and not isinstance(literal, bool) and isinstance(value, str):
        try:
            return Decimal(value)
        except InvalidOperation:
            return None
    if isinstance(literal, Decimal) and isinstance(value, float):
        return Decimal(repr(value))
    return value


def _compare(column: str, op: Callable[[Any, Any], bool], literal: Any) -> _Eval:
    def evaluate(row: Row) -> Truth:
        value = row.get(column)
        if value is None or literal is None:
            return None
        try:
            return op(_comparable(value, literal), literal)
        except TypeError:  # a text column against a number that is no number, and the like
            return None

    return evaluate


def _member(column: str, items: list[Any], negated: bool) -> _Eval:
    def evaluate(row: Row) -> Truth:
        value = row.get(column)
        if value is None:
            return None
        found = any(_comparable(value, item) == item for item in items if item is not None)
        if not found and any(item is None for item in items):
            return None
        return found != negated

    return evaluate


def _all(terms: list[_Eval]) -> _Eval:
    return _kleene(terms, decisive=False)


def _any(terms: list[_Eval]) -> _Eval:
    return _kleene(terms, decisive=True)


def _kleene(terms: list[_Eval], *, decisive: bool) -> _Eval:
    """`and` (a false term decides) or `or` (a true term decides) in three-valued logic: without a
    deciding term, unknown if any term is, else the other value."""

    def evaluate(row: Row) -> Truth:
        unknown = False
        for term in terms:
            v = term(row)
            if v is decisive:
                return decisive
            unknown = unknown or v is None
        return None if unknown else not decisive

    return evaluate
