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
is still open then is "inconclusive". A quick run (--quick) judges differently,
see ``judge``: what it cannot call is "provisional", which is not a verdict.

A section may declare the comparison its results lead with (``Headline``): the
harness turns it into the first line of the report.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

LEVEL = 0.95
MET, MISSED, INCONCLUSIVE, NOT_RUN = "met", "missed", "inconclusive", "not measured"
NOT_RESOLVED = "provisional"   # a quick run's: too close to its target to call


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


# A quick run's interval rests on a few repetitions (with 6, it is their minimum and maximum):
# one disturbed repetition moves a bound, and two back-to-back quick runs at the same median
# (1.27 x, goal 1.10) called the same target "met" and "not resolved" in turn. Its median moves
# far less. So a quick run (run.py sets quick_margin) calls a target from the median, where the
# median clears the goal by this share of it, unless the interval is too wide to trust it: it
# reaches past the goal by that share on the wrong side too (a busy machine's, e.g. a median of
# 1.26 in [0.48, 1.54]). Otherwise the target is left open ("provisional": a full run decides
# it on its whole interval).
quick_margin = 0.0


def judge(iv: Interval, goal: float, higher_is_better: bool) -> str:
    """MET / MISSED / INCONCLUSIVE (NOT_RUN without values). A full run: MET when the whole
    interval clears the goal, MISSED when it is all on the wrong side. A quick run
    (quick_margin > 0): MET or MISSED when the median clears the goal by quick_margin of it
    and the interval stays within quick_margin of the goal on the other side; INCONCLUSIVE
    otherwise, and with too few repetitions for an interval."""
    if iv.n == 0:
        return NOT_RUN
    if math.isnan(iv.lo):
        return INCONCLUSIVE
    sign = 1 if higher_is_better else -1
    lo, hi = sorted((sign * iv.lo, sign * iv.hi))
    g, m, med = sign * goal, quick_margin * abs(goal), sign * iv.median
    if quick_margin > 0:
        if med >= g + m and lo >= g - m:
            return MET
        if med < g - m and hi < g + m:
            return MISSED
        return INCONCLUSIVE
    if lo >= g:
        return MET
    if hi < g:
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
    name: str = ""     # the other, short, for the first line (default: other)
    role: str = ""     # what the other is, e.g. "the fastest other loader"
    where: str = ""    # where it was measured, short, for the first line (default: what)
    goal: float | None = None   # the verdict's target ratio (the speed-ratio form)

    def as_dict(self):
        return asdict(self)

    def first_line(self, cores: int) -> str:
        """The report's first line, at most FIRST_LINE_MAX characters: who won, by how much,
        against what, where, and whether it holds (the verdict, or in a quick run
        "provisional"); the figures and words are the table's. Parts are left out, least
        needed first, until it fits."""
        iv, other, where = self.ratio, self.name or self.other, self.where or self.what
        if iv.n == 0:
            return _fit([f"{self.ours} against {other}: not measured", f" ({where})", "."], optional=(1,))
        speed = self.verdict is not None   # ours / other, higher is better; else a time ratio
        k, lo, hi = (iv.median, iv.lo, iv.hi) if speed else (1 / iv.median, 1 / iv.hi, 1 / iv.lo)
        wins = k >= 1
        winner, loser = (self.ours, other) if wins else (other, self.ours)
        if not wins:
            k, lo, hi = 1 / k, 1 / hi, 1 / lo
        unit = "in batches/s" if speed else self.better.join(("(", ")"))
        bounds = "" if math.isnan(lo) else f" [95%: {lo:.2f}-{hi:.2f}]"
        shorter = (winner, _short(loser)) if len(loser) >= len(winner) else (_short(winner), loser)
        for names in ((winner, loser), shorter, (_short(winner), _short(loser))):
            role = f" ({self.role})" if self.role else ""   # said of the other, wherever it stands
            line = _fit([names[0], role if not wins else "", f" beat {names[1]}", role if wins else "",
                         f" by {k:.2f}x", bounds, f" {unit}", f", {where}, {cores} cores", f": {self._holds(iv)}."],
                        optional=(7, 1, 3, 5, 6))
            if len(line) <= FIRST_LINE_MAX:
                return line
        return line[:FIRST_LINE_MAX - 1] + "…"

    def _holds(self, iv: Interval) -> str:
        """Whether the lead holds, in the verdict's words."""
        busy = " (busy machine)" if self.verdict is not None and self.verdict.busy else ""
        if self.verdict is not None:
            target = f"target >= {self.goal:.2f}x" if self.goal is not None else "its target"
            return {MET: f"holds ({target}: met)", MISSED: f"does not hold ({target}: missed)",
                    INCONCLUSIVE: f"too close to call ({target})",
                    NOT_RESOLVED: f"provisional (quick run; {target})"}.get(
                        self.verdict.status, f"{target}: {self.verdict.status}") + busy
        if math.isnan(iv.lo) or iv.lo <= 1 <= iv.hi:
            return "within noise, too close to call"
        return "holds (its 95% interval excludes 1)"

    def sentence(self, machine: str, quick: bool) -> str:
        iv = self.ratio
        where = f"on this machine ({machine})"
        if iv.n == 0:
            return f"{self.ours} against {self.other} {self.what}: not measured {where}."
        if self.verdict is not None:
            v = self.verdict
            st = {MET: "met", MISSED: "missed", INCONCLUSIVE: "too close to call",
                  NOT_RESOLVED: "provisional (a quick run; run without --quick to decide)"}.get(v.status, v.status)
            busy = " Other processes were busy meanwhile: re-run on a quiet machine before quoting it." if v.busy else ""
            return (f"{self.ours} loads {iv.text(2)} x the batches/s of {self.other} {self.what} {where}, "
                    f"median [95% interval]; {v.target}: {st}.{busy}")
        if math.isnan(iv.lo) or iv.lo <= 1 <= iv.hi:
            tail = (" provisional (a quick run; run without --quick for more repetitions)." if quick
                    else " too close to call.")
            return (f"{self.ours} and {self.other} are within noise of each other {self.what} {where}: "
                    f"time ratio {iv.text(2)},{tail}")
        if iv.hi < 1:
            k, lo, hi, word = 1 / iv.median, 1 / iv.hi, 1 / iv.lo, self.better
        else:
            k, lo, hi, word = iv.median, iv.lo, iv.hi, self.worse
        return (f"{self.ours} is {k:.2f}x {word} than {self.other} {self.what} {where} "
                f"(95% interval {lo:.2f}-{hi:.2f}x).")


FIRST_LINE_MAX = 160


def _fit(parts, optional=()):
    """The parts joined, leaving out the optional ones (by index, last first) while the line is
    longer than FIRST_LINE_MAX."""
    parts, drop = list(parts), list(optional)
    while len("".join(parts)) > FIRST_LINE_MAX and drop:
        parts[drop.pop()] = ""
    return "".join(parts)


def _short(name: str) -> str:
    """A row's name without its arguments: "torch DataLoader(num_workers=2, ...)" -> "torch DataLoader(…)"."""
    return re.sub(r"\(.*\)", "(…)", name)
