"""`Lsn`: a PostgreSQL WAL position as a value object (`16/B374D848`), ordered and hashable."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["Lsn"]


class Lsn(int):
    """An LSN is a 64-bit position; it prints as `hi/lo` in upper-case hex, like PostgreSQL."""

    ZERO: ClassVar[Lsn]

    def __new__(cls, value: int = 0) -> Lsn:
        if not 0 <= value < 1 << 64:
            raise ValueError(f"LSN out of range: {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """`Lsn.parse("16/B374D848")`; raises ValueError naming the bad text."""
        hi, sep, lo = text.strip().partition("/")
        if not sep or not hi or not lo:
            raise ValueError(f"not an LSN: {text!r} (expected like 16/B374D848)")
        try:
            return cls((int(hi, 16) << 32) | int(lo, 16))
        except ValueError:
            raise ValueError(f"not an LSN: {text!r} (expected like 16/B374D848)") from None

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


Lsn.ZERO = Lsn(0)
