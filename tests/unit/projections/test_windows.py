import pytest

from tributary.projections.definition import WindowSpec
from tributary.projections.errors import DefinitionError
from tributary.projections.windows import admit, assign, running_max_before, split_sessions, watermark

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("spec", "t", "expected"),
    [
        (WindowSpec.tumbling(10), 0, [(0, 10)]),
        (WindowSpec.tumbling(10), 9, [(0, 10)]),
        (WindowSpec.tumbling(10), 10, [(10, 20)]),
        (WindowSpec.tumbling(10), -1, [(-10, 0)]),
        (WindowSpec.hopping(10, 5), 7, [(0, 10), (5, 15)]),
        (WindowSpec.hopping(10, 5), 5, [(0, 10), (5, 15)]),
        (WindowSpec.hopping(10, 5), 4, [(-5, 5), (0, 10)]),
        (WindowSpec.hopping(10, 10), 4, [(0, 10)]),
        (WindowSpec.hopping(9, 3), 10, [(3, 12), (6, 15), (9, 18)]),
    ],
)
def test_assign(spec: WindowSpec, t: int, expected: list[tuple[int, int]]) -> None:
    assert assign(spec, t) == expected
    assert all(s <= t < e for s, e in assign(spec, t))


@pytest.mark.parametrize(
    ("case", "spec", "end", "max_before", "admitted"),
    [
        ("first record: nothing seen", WindowSpec.tumbling(10), 10, None, True),
        ("in order", WindowSpec.tumbling(10), 20, 12, True),
        ("out of order, window still open", WindowSpec.tumbling(10), 10, 9, True),
        ("too late, drop", WindowSpec.tumbling(10), 10, 15, False),
        ("out of order within lateness", WindowSpec.tumbling(10, lateness=5), 10, 14, True),
        (
            "watermark exactly at the end closes it",
            WindowSpec.tumbling(10, lateness=5),
            10,
            15,
            False,
        ),
        ("beyond lateness, drop", WindowSpec.tumbling(10, lateness=5), 10, 16, False),
        (
            "late, update within grace",
            WindowSpec.tumbling(10, late="update", grace=5),
            10,
            14,
            True,
        ),
        (
            "late, update beyond grace",
            WindowSpec.tumbling(10, late="update", grace=5),
            10,
            15,
            False,
        ),
        (
            "late, update with lateness",
            WindowSpec.tumbling(10, lateness=2, late="update", grace=5),
            10,
            16,
            True,
        ),
    ],
)
def test_admit(case: str, spec: WindowSpec, end: int, max_before: int | None, admitted: bool) -> None:
    assert admit(spec, end, watermark(max_before, spec.lateness)) is admitted, case


def test_watermark_closes_window_at_its_end() -> None:
    spec = WindowSpec.tumbling(10, lateness=5)
    assert admit(spec, 10, watermark(14, 5)) is True  # wm 9 < 10
    assert admit(spec, 10, watermark(15, 5)) is False  # wm 10 == end


@pytest.mark.parametrize(
    ("times", "gap", "sessions"),
    [
        ([], 5, []),
        ([1], 5, [(1, 6)]),
        ([1, 3, 7], 5, [(1, 12)]),
        ([1, 6], 5, [(1, 6), (6, 11)]),
        ([1, 5, 20, 21, 40], 5, [(1, 10), (20, 26), (40, 45)]),
    ],
)
def test_split_sessions(times: list[int], gap: int, sessions: list[tuple[int, int]]) -> None:
    assert split_sessions(times, gap) == sessions


def test_running_max_before() -> None:
    assert running_max_before([5, 3, 9, 1]) == [None, 5, 5, 9]
    assert running_max_before([5, 3], base=7) == [7, 7]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kind="tumbling"),
        dict(kind="hopping", size=10, hop=20),
        dict(kind="session"),
        dict(kind="tumbling", size=10, late="keep"),
        dict(kind="tumbling", size=10, lateness=-1),
    ],
)
def test_bad_windows_are_refused(kwargs: dict) -> None:
    with pytest.raises(DefinitionError):
        WindowSpec(**kwargs)
