"""Settings as they may be shown (`tributary config show`): API keys, DSN passwords and secret
Spark settings masked.

Masking works on each value, not on the rendered text, so the output stays valid JSON whatever a
password contains (quotes, spaces, `@`)."""

from __future__ import annotations

import re

from pydantic import BaseModel

from tributary.jsonvalue import JsonObject, JsonValue

__all__ = ["MASK", "mask_dsn", "masked"]

MASK = "***"

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<netloc>[^/?#]*)(?P<rest>.*)$", re.DOTALL)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")
# libpq keyword/value form: password=secret or password='it''s quoted \' with spaces'
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*)")


def mask_dsn(text: str) -> str:
    """`text` with the password of a URL (`scheme://user:pw@host`, `?password=`) or of a libpq
    keyword string (`password=…`) replaced by ***; anything else unchanged."""
    url = _URL.match(text)
    if url is None:
        return _KEYWORD_PASSWORD.sub(lambda m: m.group(1) + MASK, text)
    netloc = url["netloc"]
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:{MASK}@{hosts}"
    rest = _QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, url["rest"])
    return f"{url['scheme']}{netloc}{rest}"


# Spark's own `spark.redaction.regex` default: the settings whose values its UI and logs hide.
_SPARK_SECRET = re.compile(r"(?i)secret|password|token|access[.]?key")


def _mask(value: JsonValue, key: str | None) -> JsonValue:
    if isinstance(value, dict) and key in ("headers", "client"):  # a sink's headers, Kafka's client settings
        return {k: MASK for k in value}
    if isinstance(value, dict) and key == "spark_conf":
        return {k: MASK if _SPARK_SECRET.search(k) else _mask(v, k) for k, v in value.items()}
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key) for v in value]
    if isinstance(value, str):
        return MASK if key in ("key", "hash_salt") else mask_dsn(value)
    return value


def masked(settings: BaseModel) -> JsonObject:
    """The settings as JSON-ready data (keys as the TOML spells them), every API key (a `key`
        field) and every password in a DSN or URL and every `spark_conf` value whose key names a secret (Spark's
    redaction pattern) replaced by ***."""
    data: JsonObject = _mask(settings.model_dump(mode="json", by_alias=True), None)
    return data
