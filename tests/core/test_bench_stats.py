"""The benchmark's intervals (bench/_stats.py; SPEC §7: a verdict is met only when the
whole 95 % interval clears its target). The median's interval is the sign test's: these
are the textbook order statistics, so a wrong binomial count shows here."""
import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import _stats as S  # noqa: E402

pytestmark = pytest.mark.full  # the long tier (tests/run.sh --full)


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


@pytest.mark.parametrize(("goal", "median", "lo", "hi", "higher", "full", "quick"), [
    (1.10, 1.27, 1.13, 1.35, True, S.MET, S.MET),                # 15 % above the goal
    (1.10, 1.27, 1.20, 1.33, True, S.MET, S.MET),                # the same median, a narrower interval
    (1.10, 1.27, 1.05, 1.40, True, S.INCONCLUSIVE, S.MET),       # one slow repetition: the quick call stands
    (1.10, 1.26, 0.48, 1.54, True, S.INCONCLUSIVE, S.INCONCLUSIVE),  # a busy machine's: too wide to call
    (1.10, 0.90, 0.60, 1.30, True, S.INCONCLUSIVE, S.INCONCLUSIVE),
    (1.10, 1.17, 1.12, 1.22, True, S.MET, S.INCONCLUSIVE),       # 6 % above: a full run's call only
    (1.10, 1.12, 1.05, 1.16, True, S.INCONCLUSIVE, S.INCONCLUSIVE),
    (1.10, 0.95, 0.90, 1.00, True, S.MISSED, S.MISSED),
    (1.0, 0.67, 0.33, 0.75, False, S.MET, S.MET),                # a cost: lower is better
    (1.0, 0.98, 0.97, 0.99, False, S.MET, S.INCONCLUSIVE),
    (1.0, 1.15, 1.01, 1.20, False, S.MISSED, S.MISSED),
])
def test_quick_mode_calls_a_target_from_its_median_with_a_margin(monkeypatch, goal, median, lo, hi, higher, full,
                                                                  quick):
    """Two back-to-back quick runs must give the same verdicts: their few repetitions make
    intervals whose bounds one slow repetition moves (1.27 x Grain was "met", then "not
    resolved"), so a quick run calls a target from the median, where it clears the target by
    10 % and the interval does not reach 10 % past it on the other side (then it is too wide to
    call); a full run calls the whole interval against the target itself."""
    iv = S.Interval(median=median, lo=lo, hi=hi, n=10)
    assert S.judge(iv, goal, higher) == full
    monkeypatch.setattr(S, "quick_margin", 0.10)
    assert S.judge(iv, goal, higher) == quick


def test_a_quick_run_with_too_few_repetitions_calls_nothing(monkeypatch):
    monkeypatch.setattr(S, "quick_margin", 0.10)
    assert S.judge(S.interval([2.0] * 5), 1.10, True) == S.INCONCLUSIVE
