"""Personal data in events: which fields hold it, sealing them under a subject's key, revealing them.

An event model marks a field with `Annotated[str, PersonalData()]` (the subject is the stream) or
`PersonalData(subject="customer_id")` (the subject is named by another field of the event). Such a
field is stored as an envelope, `{"$enc": "v1", "subject", "kid", "ct", "erased"}`: the value's JSON,
AES-GCM-encrypted under the subject's key `kid` (`ct`: base64 of nonce + ciphertext, the subject and
kid authenticated with it), and the value readers get once that key is destroyed (`erased`). The
envelope describes itself, so any reader reveals it without the aggregate that wrote it.

Pure apart from the random nonce: the keys come in as arguments (`keys.py` finds them).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, PydanticUndefinedAnnotation, TypeAdapter, ValidationError

__all__ = [
    "ENVELOPE",
    "ERASED",
    "KeyId",
    "PersonalData",
    "PersonalField",
    "check_model",
    "has_envelopes",
    "personal_fields",
    "reveal",
    "seal",
    "sealed_keys",
]

ENVELOPE = "$enc"  # the key that marks a sealed value, with the format version as its value
_V1 = "v1"
ERASED = "<erased>"  # what a string field reads as once its subject is forgotten
_NONCE = 12  # bytes: AES-GCM's standard nonce, random per value (2**32 values per key stay safe)

KeyId = tuple[str, int]  # (subject id, key version)


@dataclass(frozen=True, slots=True)
class PersonalData:
    """Marks an event field as personal data. `subject`: the event field holding the data
    subject's id (None: the stream id). `erased`: the value read once the subject is forgotten
    (default `"<erased>"` for a field that accepts it, else None); it must validate."""

    subject: str | None = None
    erased: Any = ...


@dataclass(frozen=True, slots=True)
class PersonalField:
    name: str
    subject: str | None
    erased: Any


def _marker(metadata: Collection[object]) -> PersonalData | None:
    return next((m for m in metadata if isinstance(m, PersonalData)), None)


def _accepts(adapter: TypeAdapter[Any], value: object) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


@cache
def personal_fields(model: type[BaseModel]) -> tuple[PersonalField, ...]:
    """The model's personal-data fields (cached per class: models are immutable definitions).
    Raises ValueError when a placeholder would not validate or a subject field is missing."""
    if not model.__pydantic_complete__:  # annotations not resolved yet: its fields would look unmarked
        try:
            model.model_rebuild()
        except PydanticUndefinedAnnotation as exc:
            raise ValueError(f"{model.__name__}: {exc}") from None
    out = []
    for name, info in model.model_fields.items():
        marker = _marker(info.metadata)
        if marker is None:
            nested = info.annotation
            if isinstance(nested, type) and issubclass(nested, BaseModel) and personal_fields(nested):
                raise ValueError(
                    f"{model.__name__}.{name}: {nested.__name__} marks personal data inside it; only an event's "
                    f"own fields are sealed: mark {name} itself"
                )
            continue
        if marker.subject is not None and (marker.subject not in model.model_fields or marker.subject == name):
            raise ValueError(f"{model.__name__}.{name}: PersonalData(subject={marker.subject!r}) names no other field")
        adapter: TypeAdapter[Any] = TypeAdapter(Annotated[info.annotation, info])  # type: ignore[arg-type]  # a type built at run time
        if marker.erased is not ...:
            erased = marker.erased
        elif _accepts(adapter, ERASED):
            erased = ERASED
        else:
            erased = None
        if not _accepts(adapter, erased):
            raise ValueError(
                f"{model.__name__}.{name}: the erased value {erased!r} does not validate; "
                "make the field optional or give PersonalData(erased=…)"
            )
        out.append(PersonalField(name, marker.subject, erased))
    return tuple(out)


def check_model(model: type[BaseModel]) -> str | None:
    """The problem with the model's personal-data markers, or None (for `Aggregate`'s checks)."""
    try:
        personal_fields(model)
    except ValueError as exc:
        return str(exc)
    return None


def _aead(key: bytes) -> Any:
    """AES-GCM over `key` (imported here: only services that hold personal data need the package)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def _aad(subject: str, kid: int) -> bytes:
    return orjson.dumps([subject, kid])  # binds the ciphertext to its subject and key version


def subjects_of(fields: tuple[PersonalField, ...], data: Mapping[str, Any], stream_id: str) -> set[str]:
    return {str(data[f.subject]) if f.subject is not None else stream_id for f in fields if f.name in data}


def seal(
    fields: tuple[PersonalField, ...],
    data: Mapping[str, Any],
    stream_id: str,
    keys: Mapping[str, tuple[int, bytes]],
) -> dict[str, Any]:
    """`data` (JSON-ready) with each personal field replaced by its envelope; `keys`: the current
    (kid, key) of every subject (`subjects_of`)."""
    out = dict(data)
    for f in fields:
        if f.name not in data:
            continue
        subject = str(data[f.subject]) if f.subject is not None else stream_id
        kid, key = keys[subject]
        nonce = os.urandom(_NONCE)
        ct = _aead(key).encrypt(nonce, orjson.dumps(data[f.name]), _aad(subject, kid))
        out[f.name] = {
            ENVELOPE: _V1,
            "subject": subject,
            "kid": kid,
            "ct": base64.b64encode(nonce + ct).decode(),
            "erased": f.erased,
        }
    return out


def _is_envelope(value: object) -> bool:
    return isinstance(value, dict) and value.get(ENVELOPE) == _V1


def has_envelopes(data: object) -> bool:
    """Whether any top-level value of `data` is sealed (cheap: reads skip the key lookup if not)."""
    return isinstance(data, dict) and any(_is_envelope(v) for v in data.values())


def sealed_keys(data: object) -> set[KeyId]:
    """The (subject, kid) of every sealed value in `data`: the keys a reader must fetch."""
    if not isinstance(data, dict):
        return set()
    return {(v["subject"], int(v["kid"])) for v in data.values() if _is_envelope(v)}


def _open(envelope: Mapping[str, Any], key: bytes | None) -> Any:
    if key is None:
        return envelope.get("erased")
    from cryptography.exceptions import InvalidTag

    raw = base64.b64decode(envelope["ct"])
    try:
        plain = _aead(key).decrypt(raw[:_NONCE], raw[_NONCE:], _aad(envelope["subject"], int(envelope["kid"])))
    except InvalidTag:  # not this key's (a key made after the original was destroyed): erased
        return envelope.get("erased")
    return orjson.loads(plain)


def reveal(data: Any, key: Callable[[KeyId], bytes | None]) -> Any:
    """`data` with each envelope replaced by its value, or by its `erased` value when `key`
    returns None (the subject was forgotten). Data without envelopes is returned as it is."""
    if not has_envelopes(data):
        return data
    return {k: _open(v, key((v["subject"], int(v["kid"])))) if _is_envelope(v) else v for k, v in data.items()}
