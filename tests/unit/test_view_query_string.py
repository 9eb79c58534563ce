"""The view fast path's query-string split equals `parse_qsl(..., keep_blank_values=True)`."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.api.http.routes_views import _query_items

pytestmark = pytest.mark.unit

PIECES = st.sampled_from(["a", "id", "grp__gte", "=", "&", "", "x=y", "1", "%20", "+", "%", "é", ";", "==", "&&"])


@given(st.lists(PIECES, max_size=12).map("".join))
def test_same_pairs_as_parse_qsl(query: str) -> None:
    assert _query_items(query) == parse_qsl(query, keep_blank_values=True)


def test_examples() -> None:
    assert _query_items("id=1&limit=100") == [("id", "1"), ("limit", "100")]
    assert _query_items("a&b=&&c=d=e") == [("a", ""), ("b", ""), ("c", "d=e")]
    assert _query_items("note=a+b%26c") == [("note", "a b&c")]
    assert _query_items("") == []
