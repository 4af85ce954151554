"""Intervals and verdicts from repeated, interleaved measurements.

A figure is the median of per-repetition values (usually the ratio of two rows
timed in the same repetition, so a noisy neighbour slows both alike), with the
distribution-free 95 % confidence interval of that median (order statistics,
the sign test's interval: the same bounds as ``scipy.stats.quantile_test(x,
p=0.5).confidence_interval()``, computed here from exact binomial counts so the
bench needs no scipy): it assumes no normal shape, one disturbed repetition
cannot drag it, and with fewer than 6 repetitions it is honestly unbounded. A verdict is "met" only when the whole
interval clears the target, "missed" when the whole interval is on the wrong
side, else "inconclusive". When an interval straddles its target after the
planned repetitions, the section runs more (``repetitions``), up to a cap; what
is still open then is "inconclusive", or in --quick "not resolved in quick
mode" (a quick run is too short to call it, which is not a verdict).

A section may declare the comparison its results lead with (``Headline``): the
harness turns it into the first line of the report.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

LEVEL = 0.95
MET, MISSED, INCONCLUSIVE, NOT_RUN = "met", "missed", "inconclusive", "not measured"
NOT_RESOLVED = "not resolved in quick mode"


@dataclass
class Interval:
    median: float
    lo: float  # nan when there are too few repetitions for the level
    hi: float
    n: int

    def text(self, digits: int = 2) -> str:
        if self.n == 0:
            return "n/a"
        m = f"{self.median:.{digits}f}"
        if math.isnan(self.lo):
            return f"{m} [too few reps]"
        return f"{m} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"

    def errbar(self):
        """(below, above) lengths for a plot's error bar; 0 where the interval is unbounded."""
        if math.isnan(self.lo):
            return 0.0, 0.0
        return max(self.median - self.lo, 0.0), max(self.hi - self.median, 0.0)


def interval(xs) -> Interval:
    """Median of xs and its 95 % confidence interval (nan bounds below 6 values)."""
    x = np.asarray([v for v in xs if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    lo, hi = median_bounds(x.size)
    x.sort()
    return Interval(float(np.median(x)), float(x[lo]) if lo >= 0 else math.nan,
                    float(x[hi]) if hi < x.size else math.nan, int(x.size))


def median_bounds(n: int, level: float = LEVEL) -> tuple[int, int]:
    """Indices into n sorted values of the median's two-sided confidence interval: with
    B ~ Binomial(n, 1/2), lo = (the smallest k with P(B <= k) >= a) - 1 and hi = the smallest k
    with P(B > k) <= a, a = (1 - level) / 2; -1 or n where the interval is unbounded. In
    integers (counts of 2**n outcomes), so no rounding decides a bound."""
    a, total, below = (1 - level) / 2, 2**n, 0
    cdf = []
    for k in range(n + 1):
        below += math.comb(n, k)
        cdf.append(below)   # outcomes with B <= k
    lo = next(k for k in range(n + 1) if cdf[k] >= a * total) - 1
    hi = next(k for k in range(n + 1) if total - cdf[k] <= a * total)
    return lo, hi


def ratios(a, b) -> list[float]:
    """Per-repetition a/b of two rows measured in the same repetitions."""
    return [x / y if y > 0 else math.inf for x, y in zip(a, b)]


@dataclass
class Verdict:
    target: str     # what is promised, in a user's words
    measured: str   # the figure with its interval
    status: str     # MET, MISSED, INCONCLUSIVE, NOT_RESOLVED or NOT_RUN
    note: str = ""
    busy: bool = False   # other processes used the CPUs while it was measured: take it with care

    def shown(self) -> str:
        return self.status.upper() + (" (busy machine)" if self.busy and self.status in (MET, MISSED) else "")

    def as_dict(self):
        return asdict(self)


def row_bars(ax, samples, labels=None, fontsize=8):
    """One horizontal bar per row, top to bottom: each row's median with its 95 %
    interval (``samples``: row name -> values; ``labels``: the names shown)."""
    names = list(samples)
    for i, name in enumerate(names):
        iv = interval(samples[name])
        ax.barh([i], [iv.median], xerr=[[e] for e in iv.errbar()], capsize=3, label=name)
    ax.set_yticks(range(len(names)), labels or names, fontsize=fontsize)
    ax.invert_yaxis()


# A quick run's interval rests on a few repetitions, and on a shared machine it
# covers the median less often than its nominal 95 %: two back-to-back quick runs
# called a target 7 % above its goal "met" and "not resolved" in turn. In quick
# mode (run.py sets it) an interval must clear its target by this share of the
# goal to count either way; what is closer stays open for a full run.
quick_margin = 0.0


def judge(iv: Interval, goal: float, higher_is_better: bool) -> str:
    if iv.n == 0:
        return NOT_RUN
    if math.isnan(iv.lo):
        return INCONCLUSIVE
    lo, hi = (iv.lo, iv.hi) if higher_is_better else (-iv.hi, -iv.lo)
    g = goal if higher_is_better else -goal
    m = quick_margin * abs(goal)
    if lo >= g + m:
        return MET
    if hi < g - m:
        return MISSED
    return INCONCLUSIVE


def combine(statuses) -> str:
    """One verdict over several cases: missed if any missed, met only if all met."""
    s = [x for x in statuses if x != NOT_RUN]
    if not s:
        return NOT_RUN
    if MISSED in s:
        return MISSED
    return MET if all(x == MET for x in s) else INCONCLUSIVE


def repetitions(cfg, unresolved, say, what="repetition"):
    """Repetition indexes 0, 1, ...: cfg["reps"] of them, then more while unresolved()
    (an interval still straddles its target), up to cfg["max_reps"] (the harness sets it).

    Rows stay interleaved in the extra repetitions, so they are paired like the others.
    """
    planned = cfg["reps"]
    cap = max(planned, cfg.get("max_reps", planned))
    rep = 0
    while rep < planned or (rep < cap and unresolved()):
        extra = f" (more: an interval straddles its target; at most {cap})" if rep >= planned else ""
        say(f"{what} {rep + 1}/{planned}{extra}")
        yield rep
        rep += 1


def open_verdicts(verdicts) -> bool:
    """True when a verdict could still go either way (its interval straddles the target)."""
    return any(v.status == INCONCLUSIVE for v in verdicts)


@dataclass
class Headline:
    """The comparison a section leads with: ours against what a user would otherwise write.

    Two forms. With ``verdict`` (the target the section judged on the same interval), ``ratio``
    is the per-repetition speed ratio ours / other (higher is better) and the sentence states
    that figure and that verdict, word for word the table's: the first line, the table and the
    summary cannot disagree. Without it, ``ratio`` is ours / other of a quantity where lower
    is better (time or extra cost per batch) and the sentence says "k x faster" against 1.
    Every ratio is shown with two decimals.
    """
    ours: str       # e.g. "prefetch.Loader"
    other: str      # e.g. "a plain loop over the dataset"
    what: str       # where it was measured, e.g. "per epoch of an image pipeline"
    ratio: Interval
    better: str = "faster"
    worse: str = "slower"
    verdict: Verdict | None = None   # the target judged on this same interval (the speed-ratio form)

    def as_dict(self):
        return asdict(self)

    def sentence(self, machine: str, quick: bool) -> str:
        iv = self.ratio
        where = f"on this machine ({machine})"
        if iv.n == 0:
            return f"{self.ours} against {self.other} {self.what}: not measured {where}."
        if self.verdict is not None:
            v = self.verdict
            st = {MET: "met", MISSED: "missed", INCONCLUSIVE: "too close to call",
                  NOT_RESOLVED: "not resolved in quick mode (provisional; run without --quick)"}.get(v.status, v.status)
            busy = " Other processes were busy meanwhile: re-run on a quiet machine before quoting it." if v.busy else ""
            return (f"{self.ours} loads {iv.text(2)} x the batches/s of {self.other} {self.what} {where}, "
                    f"median [95% interval]; {v.target}: {st}.{busy}")
        if math.isnan(iv.lo) or iv.lo <= 1 <= iv.hi:
            tail = (" not resolved in quick mode (run without --quick for more repetitions)." if quick
                    else " too close to call.")
            return (f"{self.ours} and {self.other} are within noise of each other {self.what} {where}: "
                    f"time ratio {iv.text(2)},{tail}")
        if iv.hi < 1:
            k, lo, hi, word = 1 / iv.median, 1 / iv.hi, 1 / iv.lo, self.better
        else:
            k, lo, hi, word = iv.median, iv.lo, iv.hi, self.worse
        return (f"{self.ours} is {k:.2f}x {word} than {self.other} {self.what} {where} "
                f"(95% interval {lo:.2f}-{hi:.2f}x).")
