"""A source database's encoding → how its streamed bytes become UTF-8. Pure.

Capture's SQL connections pin `client_encoding = UTF8` (capture/database/replication.py), so the server
converts what they read. The replication stream is not converted: wal2json writes its documents
in the database's own encoding whatever the walsender's `client_encoding`, so a stream of a
non-UTF8 database is decoded from that encoding (`python_codec`) before it is parsed. A
`SQL_ASCII` database stores bytes of unknown encoding: nothing can turn them into UTF-8 for sure,
so capture refuses it (`refusal`) rather than write invalid or wrong text into the log.
"""

from __future__ import annotations

__all__ = ["CODECS", "python_codec", "refusal"]

# PostgreSQL server encodings (https://www.postgresql.org/docs/15/multibyte.html) → Python codecs.
CODECS = {
    "UTF8": "utf-8",
    "LATIN1": "latin-1",
    "LATIN2": "iso8859-2",
    "LATIN3": "iso8859-3",
    "LATIN4": "iso8859-4",
    "LATIN5": "iso8859-9",
    "LATIN6": "iso8859-10",
    "LATIN7": "iso8859-13",
    "LATIN8": "iso8859-14",
    "LATIN9": "iso8859-15",
    "LATIN10": "iso8859-16",
    "ISO_8859_5": "iso8859-5",
    "ISO_8859_6": "iso8859-6",
    "ISO_8859_7": "iso8859-7",
    "ISO_8859_8": "iso8859-8",
    "WIN866": "cp866",
    "WIN874": "cp874",
    "WIN1250": "cp1250",
    "WIN1251": "cp1251",
    "WIN1252": "cp1252",
    "WIN1253": "cp1253",
    "WIN1254": "cp1254",
    "WIN1255": "cp1255",
    "WIN1256": "cp1256",
    "WIN1257": "cp1257",
    "WIN1258": "cp1258",
    "KOI8R": "koi8-r",
    "KOI8U": "koi8-u",
    "EUC_JP": "euc_jp",
    "EUC_JIS_2004": "euc_jis_2004",
    "EUC_KR": "euc_kr",
    "EUC_CN": "gb2312",
}


def python_codec(server_encoding: str) -> str | None:
    """The Python codec of a server encoding; None for one capture cannot decode (`refusal`)."""
    return CODECS.get(server_encoding.upper())


def refusal(server_encoding: str, *, database: str) -> str | None:
    """Why a database of this encoding cannot be captured (one line), None when it can."""
    if server_encoding.upper() == "SQL_ASCII":
        return (
            f"database {database!r} has encoding SQL_ASCII: its text is bytes of unknown encoding, which "
            "cannot be turned into UTF-8 for sure; capture a database with a real encoding (UTF8, LATIN1, …)"
        )
    if python_codec(server_encoding) is None:
        return f"database {database!r} has encoding {server_encoding}, which capture cannot decode; use UTF8"
    return None
