"""The typed INSERT encoder (capture/_hotpath.pyx `encode_inserts`, Cython) against its Python
reference (`InsertTemplate.encode_many_python`). Pure.

The law: on any input the typed function answers None (the caller then runs the reference) or
exactly the reference's (keys, values); where the reference declines or raises, it declines. On
the documents PostgreSQL writes it must not decline, or the typed path would be pointless.
"""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tributary.capture import compiled
from tributary.capture.decoding.wal2json import Change, parse_message
from tributary.capture.streaming import insert_template as it

pytestmark = pytest.mark.unit

c_encode = compiled.encode_inserts


def test_the_extension_is_built() -> None:
    """`pip install -e .` builds capture/_hotpath.pyx in place: the tests run the typed path."""
    assert compiled.encode_inserts is not None and compiled.take_inserts is not None


# Per type: (wal2json type name, typeoid, tokens PostgreSQL prints, tokens a rule must decline or
# that are odd in some other way).
_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10).map(orjson.dumps)
_TSTZ = st.datetimes().map(lambda d: b'"%s+00"' % d.isoformat(sep=" ").encode())
_TS = st.datetimes().map(lambda d: b'"%s"' % d.isoformat(sep=" ").encode())
_INT = st.integers(-(2**63), 2**63 - 1).map(lambda i: b"%d" % i)
_NUM = st.decimals(allow_nan=False, allow_infinity=False, places=4).map(lambda d: format(d, "f").encode())
_TYPES: dict[str, tuple[str, int, st.SearchStrategy[bytes], list[bytes]]] = {
    "bigint": ("bigint", 20, _INT, [b"36893488147419103232", b"-0", b"", b'"1"']),  # 65-bit, odd
    "bool": ("boolean", 16, st.sampled_from([b"true", b"false"]), [b"maybe"]),
    "numeric": ("numeric(20,4)", 1700, _NUM, [b"-0", b"", b'"1.5"', b"1e5"]),
    "text": (
        "text",
        25,
        _TEXT,
        [b'"\\u0001"', b'"a\\u00e9"', b"12", b"nullx", b'"\\\\u"', b'"tab\\tnew\\nline"', b'"%d%b%%"'],
    ),
    "varchar": ("character varying(20)", 1043, _TEXT, [b'"x\\u0000"']),
    "bytea": ("bytea", 17, st.binary(max_size=8).map(lambda b: b'"%s"' % b.hex().encode()), [b'"\\\\x00"', b"00"]),
    "tstz": (
        "timestamp with time zone",
        1184,
        _TSTZ,
        [
            b'"infinity"',
            b'"-infinity"',
            b'"0044-03-15 12:00:00+00 BC"',
            b'"12345-01-01 00:00:00+00"',
            b'"2024-01-01 00:00:00+05:30"',
            b'"2024-01-01 00:00:00+00"+00"',  # a second `+00"`: never printed, declined
            b'"2024-01-01 00:00:00-00+00"',
            b'"2024-01-01T00:00:00+00"',
            b'"2024-1-01 00:00:00+00"',
        ],
    ),
    "ts": (
        "timestamp without time zone",
        1114,
        _TS,
        [b'"infinity"', b'"0044-03-15 12:00:00 BC"', b'"12345-01-01 00:00:00"', b'"2024-01-01"', b'"2024-01-01  x"'],
    ),
    "float": (
        "double precision",
        701,
        st.floats(allow_nan=False, allow_infinity=False).map(orjson.dumps),
        [b'"NaN"', b'"Infinity"', b"1e400", b"[1"],
    ),
    "jsonb": ("jsonb", 3802, st.sampled_from([b'"{\\"k\\": [1, 2.50]}"', b'"[]"']), [b'"{"', b"nope"]),
    "intarr": ("integer[]", 1007, st.sampled_from([b'"{1,NULL}"', b'"{}"']), [b'"{x}"']),
    "uuid": ("uuid", 2950, st.uuids().map(lambda u: b'"%s"' % str(u).encode()), [b'"\\u0041"']),
}


def _token(kind: str, odd: bool) -> st.SearchStrategy[bytes]:
    _, _, usual, odd_tokens = _TYPES[kind]
    return (
        st.one_of(usual, st.just(b"null"), st.sampled_from(odd_tokens)) if odd else st.one_of(usual, st.just(b"null"))
    )


_NAME = st.one_of(st.sampled_from(["id", "a", "b", "k ey", "%d", 'q"uote', "é"]), st.text(min_size=1, max_size=4))


@st.composite
def _table(draw: st.DrawFn) -> tuple[list[str], list[str], list[str]]:
    kinds = draw(st.lists(st.sampled_from(sorted(_TYPES)), min_size=1, max_size=6))
    names = draw(st.lists(_NAME, min_size=len(kinds), max_size=len(kinds), unique=True))
    pk = draw(st.lists(st.sampled_from(names), max_size=2, unique=True))
    return kinds, names, pk


def _doc(kinds: list[str], names: list[str], pk: list[str], tokens: list[bytes], lsn: bytes, xid: int) -> bytes:
    cols = b",".join(
        b'{"name":%b,"type":%b,"typeoid":%d,"value":%b}'
        % (orjson.dumps(n), orjson.dumps(_TYPES[k][0]), _TYPES[k][1], tok)
        for k, n, tok in zip(kinds, names, tokens, strict=True)
    )
    keys = b",".join(
        b'{"name":%b,"type":%b,"typeoid":%d}' % (orjson.dumps(n), orjson.dumps(_TYPES[k][0]), _TYPES[k][1])
        for k, n in zip(kinds, names, strict=True)
        if n in pk
    )
    tail = b'],"pk":[%b]}' % keys if pk else b"]}"
    return (
        b'{"action":"I","xid":%d,"timestamp":"2026-11-22 23:26:02.681837+00","lsn":"%b","schema":"public",'
        b'"table":"t%%","columns":[%b%b' % (xid, lsn, cols, tail)
    )


def _template(doc: bytes) -> it.InsertTemplate | None:
    change = parse_message(doc)
    assert isinstance(change, Change)
    return it.InsertTemplate.build(change, doc, source_name="s", db="d", key_columns=(), announced=0)


def _agree(template: it.InsertTemplate, docs: list[bytes], tx_part: bytes, now_ms: int) -> object:
    """The typed answer equals the reference's, or it declined; returns the typed answer."""
    assert c_encode is not None
    tail = tx_part + b',"op":"c","ts_ms":%d}' % now_ms
    got = c_encode(template._spec, docs, tail)
    try:
        want = template.encode_many_python(docs, tx_part, now_ms)
    except (ValueError, IndexError):  # the reference raises on what the typed path declines (an LSN `int` cannot read)
        assert got is None
        return got
    if got is not None:
        assert got == want
    assert template.encode_many(docs, tx_part, now_ms) == want  # the dispatcher, whichever ran
    return got


_LSN = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)).map(lambda p: b"%X/%X" % p)
_TX = st.sampled_from([it.InsertTemplate.tx_part(7, 1000), it.InsertTemplate.tx_part(None, None), b"%s"])


@settings(max_examples=300)
@given(table=_table(), data=st.data(), tx_part=_TX, now_ms=st.integers(-(2**70), 2**70))
def test_usual_documents_are_encoded_typed_exactly(table, data: st.DataObject, tx_part: bytes, now_ms: int) -> None:
    kinds, names, pk = table
    rows = data.draw(st.lists(st.tuples(*[_token(k, odd=False) for k in kinds]), min_size=1, max_size=8))
    lsns = data.draw(st.lists(_LSN, min_size=len(rows), max_size=len(rows)))
    docs = [_doc(kinds, names, pk, list(row), lsn, 748) for row, lsn in zip(rows, lsns, strict=True)]
    template = _template(docs[0])
    assert template is not None
    got = _agree(template, docs, tx_part, now_ms)
    python = template.encode_many_python(docs, tx_part, now_ms)
    # Declining is allowed only where the reference declines too (a timestamp before year 1000
    # or past 9999 is not the usual shape; floats and arrays go through the generic rule).
    assert (got is None) == (python is None)


@settings(max_examples=300)
@given(table=_table(), data=st.data(), tx_part=_TX, now_ms=st.integers(0, 2**45))
def test_odd_values_are_declined_or_exact(table, data: st.DataObject, tx_part: bytes, now_ms: int) -> None:
    kinds, names, pk = table
    rows = data.draw(st.lists(st.tuples(*[_token(k, odd=True) for k in kinds]), min_size=1, max_size=6))
    first = _doc(kinds, names, pk, [b"null"] * len(kinds), b"0/1", 1)
    template = _template(first)
    assert template is not None
    docs = [first] + [_doc(kinds, names, pk, list(row), b"0/%X" % i, 1) for i, row in enumerate(rows)]
    _agree(template, docs, tx_part, now_ms)
    for doc in docs[1:]:
        _agree(template, [doc], tx_part, now_ms)


_BYTE = st.sampled_from([b'"', b",", b"/", b"\\", b":", b" ", b"-", b"+", b"0", b"F", b"\x00", b"}", b"]", b"v", b""])
_LSN_ODD = st.sampled_from(
    [
        b"0/1",
        b"123456789/0",
        b"0/123456789",
        b"1/",
        b"/1",
        b"01",
        b"0x1/2",
        b" 1/2",
        b"1_0/2",
        b"-1/2",
        b"g/1",
        b"1/2/3",
    ]
)


@settings(max_examples=400)
@given(
    table=_table(),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3), _BYTE), max_size=4),
    lsn=_LSN_ODD,
)
@example(table=(["bigint"], ["id"], ["id"]), edits=[], lsn=b"123456789/0")  # a 65-bit LSN
def test_any_bytes_are_declined_or_exact(table, edits: list[tuple[int, int, bytes]], lsn: bytes) -> None:
    """Arbitrary damage (bytes replaced or cut anywhere, LSNs `int(…, 16)` reads or refuses): the
    typed path never crashes and never differs."""
    kinds, names, pk = table
    first = _doc(kinds, names, pk, [b"null"] * len(kinds), b"0/1", 1)
    template = _template(first)
    assert template is not None
    doc = _doc(kinds, names, pk, [b"null"] * len(kinds), lsn, 1)
    for at, cut, byte in edits:
        at %= len(doc) + 1
        doc = doc[:at] + byte + doc[at + cut :]
    for docs in ([doc], [first, doc], [doc, first]):
        _agree(template, docs, it.InsertTemplate.tx_part(7, 1000), 5)


def test_the_generic_rule_runs_in_the_typed_path_too() -> None:
    """A float column's rule is Python (`orjson` parse and dump) called from the typed loop, per token."""
    kinds, names = ["bigint", "float"], ["id", "f"]
    docs = [_doc(kinds, names, ["id"], [b"%d" % i, b"%d.50" % i], b"0/%X" % i, 9) for i in range(1, 40)]
    template = _template(docs[0])
    assert template is not None
    got = _agree(template, docs, b"", 0)
    assert got is not None and got[1][0].startswith(b'{"before":null,"after":{"id":1,"f":1.5},')


def test_an_empty_run_and_wrong_arguments() -> None:
    template = _template(_doc(["bigint"], ["id"], [], [b"1"], b"0/1", 1))
    assert template is not None and c_encode is not None
    assert c_encode(template._spec, [], b"") is None
    assert c_encode(template._spec, [b"x", 3], b"") is None  # type: ignore[list-item]
    with pytest.raises(TypeError):
        c_encode((), [b"x"], b"")
    with pytest.raises(TypeError):
        c_encode(template._spec, (b"x",), b"")  # type: ignore[arg-type]
    bad_rule = (template._spec[0], (9,), *template._spec[2:])
    with pytest.raises(ValueError):
        c_encode(bad_rule, [b"x"], b"")
    bad_key = (*template._spec[:3], (5,), *template._spec[4:])
    with pytest.raises(ValueError):
        c_encode(bad_key, [b"x"], b"")


_WITHOUT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "tributary.capture._hotpath":
            raise ImportError("not built")
sys.meta_path.insert(0, Block())
from tributary.capture import compiled
from tributary.log.local.codec import encode_plain
assert compiled.encode_inserts is None and compiled.take_inserts is None
print(encode_plain(0, 1, [b"1"], [b"2"])[1])
"""


@pytest.mark.parametrize("env", [{}, {"TRIBUTARY_IMPL": "python"}, {"TRIBUTARY_PURE_PYTHON": "1"}])
def test_without_the_extension_the_reference_runs_alone(env: dict[str, str]) -> None:
    """Not built: one warning, and the pure-Python path does the work; turned off on purpose
    (TRIBUTARY_IMPL=python, or its older spelling TRIBUTARY_PURE_PYTHON=1, for A/B runs): no warning."""
    code = _WITHOUT if not env else _WITHOUT.replace('raise ImportError("not built")', "pass")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, **env}
    )
    assert out.stdout.strip() == "[92]"  # one line: the reference encoded it
    warned = "the compiled module capture._hotpath is not available" in out.stderr
    assert warned == (not env), out.stderr
