"""The benchmark's intervals (bench/_stats.py; SPEC §7: a verdict is met only when the
whole 95 % interval clears its target). The median's interval is the sign test's: these
are the textbook order statistics, so a wrong binomial count shows here."""
import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import _stats as S  # noqa: E402


@pytest.mark.parametrize(("n", "bounds"), [
    # 1-based ranks of the 95 % distribution-free interval of the median (sign test), as tabled
    # in Conover, Practical Nonparametric Statistics, and given by scipy's quantile_test
    (6, (1, 6)), (10, (2, 9)), (20, (6, 15)), (30, (10, 21)), (50, (18, 33)), (100, (40, 61)),
])
def test_median_bounds_are_the_sign_tests_order_statistics(n, bounds):
    lo, hi = S.median_bounds(n)
    assert (lo + 1, hi + 1) == bounds


@pytest.mark.parametrize("n", [1, 2, 5])
def test_fewer_than_six_values_leave_the_interval_unbounded(n):
    iv = S.interval(range(n))
    assert math.isnan(iv.lo) and math.isnan(iv.hi) and iv.n == n


def test_interval_sorts_and_ignores_non_finite_values():
    xs = [9.0, 1.0, math.nan, 5.0, 3.0, 7.0, math.inf, 2.0, 8.0, 4.0, 6.0, 10.0]
    iv = S.interval(xs)
    assert (iv.median, iv.lo, iv.hi, iv.n) == (5.5, 2.0, 9.0, 10)


@pytest.mark.parametrize(("goal", "lo", "hi", "higher", "full", "quick"), [
    (1.10, 1.12, 1.22, True, S.MET, S.INCONCLUSIVE),     # 1.8 % above the goal: a full run's call only
    (1.10, 1.16, 1.30, True, S.MET, S.MET),              # 5.5 % above: a quick run calls it too
    (1.10, 1.00, 1.07, True, S.MISSED, S.INCONCLUSIVE),
    (1.10, 0.90, 1.00, True, S.MISSED, S.MISSED),
    (1.0, 0.46, 0.75, False, S.MET, S.MET),              # a cost: lower is better
    (1.0, 0.97, 0.99, False, S.MET, S.INCONCLUSIVE),
    (1.0, 1.01, 1.20, False, S.MISSED, S.INCONCLUSIVE),
])
def test_quick_mode_calls_a_target_only_with_a_margin(monkeypatch, goal, lo, hi, higher, full, quick):
    """Issue 26 item 2: two back-to-back quick runs must give the same verdicts, so a
    quick run calls only what clears its target by a margin; a full run calls the
    whole interval against the target itself."""
    iv = S.Interval(median=(lo + hi) / 2, lo=lo, hi=hi, n=10)
    assert S.judge(iv, goal, higher) == full
    monkeypatch.setattr(S, "quick_margin", 0.05)
    assert S.judge(iv, goal, higher) == quick
