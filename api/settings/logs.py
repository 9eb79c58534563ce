"""Structured JSON logs on stderr, with secrets (passwords in DSNs, API keys) masked."""

from __future__ import annotations

import logging
import re
import sys
import time
from contextvars import ContextVar

import orjson

__all__ = ["REQUEST_ID", "JsonFormatter", "configure_json_logging", "redact"]

# The id of the HTTP request being served (set by `api.app.Service` for each request's task), so
# every record logged while serving it carries `request_id` without passing it down.
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)

# The user may be empty (postgresql://:pw@host); libpq quotes a keyword value that holds spaces.
_DSN_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]+@")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)\S+", re.IGNORECASE)


def redact(text: str) -> str:
    """Mask passwords in DSNs and key=value strings, and bearer tokens."""
    text = _DSN_PASSWORD.sub(r"\1***@", text)
    text = _KEYWORD_PASSWORD.sub(r"\1***", text)
    return _BEARER.sub(r"\1***", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id is not None:
            body["request_id"] = request_id
        for extra in ("source", "projection"):
            if hasattr(record, extra):
                body[extra] = getattr(record, extra)
        if record.exc_info:
            body["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(body).decode()


def configure_json_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
