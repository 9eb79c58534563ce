"""The client's wire, pure: server-sent events as the stream sends them, the server's problem
details as one-line errors, names as single path segments."""

from __future__ import annotations

import httpx
import pytest
from tributary_client import ConsumerError
from tributary_client._wire import error_code, message, raise_for, segment, sse_events

pytestmark = pytest.mark.unit


def test_events_with_ids_multi_line_data_comments_and_retry() -> None:
    lines = [
        ": keep-alive",
        "retry: 1000",
        "event: record",
        "id: 0:41",
        'data: {"offset":',
        "data: 41}",
        "",
        "",  # a blank line with no data yields nothing
        "event: rebalance",
        'data:{"generation": 3}',
        "",
        "data: unnamed",
    ]
    assert list(sse_events(iter(lines))) == [
        ("record", "0:41", '{"offset":\n41}'),
        ("rebalance", None, '{"generation": 3}'),
    ]  # the last event has no blank line after it yet: it is not complete


def test_a_problem_answer_gives_its_code_and_detail() -> None:
    answer = httpx.Response(409, json={"type": "about:blank", "code": "fenced", "detail": "generation 2 is over"})
    assert error_code(answer) == "fenced"
    assert message(answer) == "generation 2 is over"
    with pytest.raises(ConsumerError, match=r"^commit failed with HTTP 409: generation 2 is over$"):
        raise_for(answer, "commit")


def test_an_answer_that_is_no_problem_gives_its_status() -> None:
    page = httpx.Response(502, text="<html>bad gateway</html>")
    assert error_code(page) is None
    assert message(page) == "HTTP 502"
    assert error_code(httpx.Response(400, json=["not", "a", "problem"])) is None
    raise_for(httpx.Response(200, json={}), "fetch")  # success raises nothing


def test_group_and_member_names_stay_one_path_segment() -> None:
    assert segment("billing/eu west") == "billing%2Feu%20west"
    assert segment("sink-webhook") == "sink-webhook"
