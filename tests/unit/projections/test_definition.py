from pathlib import Path

import pytest

from tributary.projections.definition import Column, Fold, Projection, Table, WindowSpec
from tributary.projections.errors import DefinitionError
from tributary.projections.loader import load, resolve

pytestmark = pytest.mark.unit

FOLD = Fold(initial=lambda k: 0, apply=lambda s, r: s, result=lambda s: None)
TABLE = Table.of({"id": "text", "n": "numeric(20,2)"}, ["id"])


def build(records: object) -> object:
    return records


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(name="Bad-Name"), "must match"),
        (dict(name="a__b"), "without '__'"),
        (dict(version=0), "version"),
        (dict(topics=()), "no source topics"),
        (dict(fold=None), "exactly one"),
        (dict(build=build), "exactly one"),
        (dict(fold=None, build=build, window=WindowSpec.tumbling(10)), "windows apply to folds"),
    ],
)
def test_bad_projections_are_refused_with_the_reason(kwargs: dict, message: str) -> None:
    base = dict(name="p", version=1, topics=("events.x",), table=TABLE, fold=FOLD)
    with pytest.raises(DefinitionError, match=message):
        Projection(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Column("x", "text; DROP TABLE y"), "SQL type"),
        (lambda: Column("X y", "text"), "must match"),
        (lambda: Table.of({"a": "text"}, []), "primary key"),
        (lambda: Table.of({"a": "text"}, ["b"]), "not among"),
    ],
)
def test_bad_tables_are_refused(make: object, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        make()  # type: ignore[operator]


def test_loader_by_path_and_module(tmp_path: Path) -> None:
    f = tmp_path / "mine.py"
    f.write_text("from tributary.projections.examples.account_balances import make\nPROJECTION = make(name='mine')\n")
    found = load((str(f), "tributary.projections.examples.account_daily_totals"), ("shop.public.orders",))
    assert sorted(found) == ["account_daily_totals", "mine", "shop_public_orders"]
    assert resolve((str(f),), (), "mine").topics == ("events.account",)
    with pytest.raises(DefinitionError, match="no projection named 'nope'"):
        resolve((str(f),), (), "nope")


def test_loader_refuses_duplicates_and_empty_modules(tmp_path: Path) -> None:
    dup = tmp_path / "dup.py"
    dup.write_text("from tributary.projections.examples.account_balances import make\nPROJECTIONS = [make(), make()]\n")
    with pytest.raises(DefinitionError, match="two projections are named 'account_balances'"):
        load((str(dup),))
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(DefinitionError, match="must export PROJECTION"):
        load((str(empty),))
    with pytest.raises(DefinitionError, match="no file"):
        load((str(tmp_path / "missing.py"),))
