"""Which DataFrame projections merge partial aggregates, and the SQL of their merges."""

from __future__ import annotations

import pytest

from tributary.projections.definition import Fold, Projection, Table
from tributary.projections.errors import DefinitionError
from tributary.projections.examples import account_totals
from tributary.projections.incremental import merge_expression, mode

pytestmark = pytest.mark.unit

TABLE = Table.of({"id": "text", "n": "bigint", "top": "numeric(20,2)"}, ["id"])


def build(records: object) -> object:
    return records


def projection(**kwargs: object) -> Projection:
    base: dict[str, object] = dict(
        name="p", version=1, topics=("events.thing",), table=TABLE, build=build, merge={"n": "count", "top": "max"}
    )
    return Projection(**{**base, **kwargs})  # type: ignore[arg-type]


def test_the_shipped_example_runs_incrementally_and_its_plain_variant_says_why_not() -> None:
    assert mode(account_totals.PROJECTION) == "incremental"
    assert mode(account_totals.make(incremental=False)) == "recomputes: no merge declared"


def test_a_cdc_topic_recomputes_naming_it() -> None:
    p = projection(topics=("events.thing", "shop.public.orders"))
    assert mode(p) == "recomputes: shop.public.orders is a CDC topic: its updates and deletes do not decompose"


def test_folds_are_incremental() -> None:
    fold = Fold(initial=lambda k: 0, apply=lambda s, r: s, result=lambda s: None)
    assert mode(Projection(name="f", version=1, topics=("a.b.c",), table=TABLE, fold=fold)) == "incremental"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(merge={"n": "sum"}), "every column outside the primary key"),
        (dict(merge={"n": "sum", "top": "max", "id": "max"}), "every column outside the primary key"),
        (dict(merge={"n": "sum", "top": " "}), "sum|count|min|max"),
        (dict(merge={"n": "sum", "top": "1; DROP TABLE x"}), "sum|count|min|max"),
    ],
)
def test_merge_declarations_are_checked(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        projection(**kwargs)


def test_merge_applies_to_dataframe_projections_only() -> None:
    fold = Fold(initial=lambda k: 0, apply=lambda s, r: s, result=lambda s: None)
    with pytest.raises(DefinitionError, match="merge applies to DataFrame projections"):
        Projection(name="f", version=1, topics=("events.a",), table=TABLE, fold=fold, merge={"n": "sum", "top": "max"})


@pytest.mark.parametrize(
    ("how", "sql"),
    [
        ("sum", 'COALESCE(old."n" + new."n", old."n", new."n")'),
        ("COUNT", 'COALESCE(old."n" + new."n", old."n", new."n")'),
        ("min", 'LEAST(old."n", new."n")'),
        ("max", 'GREATEST(old."n", new."n")'),
        ("old.n | new.n", "old.n | new.n"),
    ],
)
def test_merge_expressions(how: str, sql: str) -> None:
    assert merge_expression("n", how).as_string(None) == sql
