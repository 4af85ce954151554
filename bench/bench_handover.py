"""Hand-over without a copy: a loader that collates a fresh array per batch
(``yield np.stack(samples)``) needs no protecting copy, and prefetch hands such
a batch over as is; a loader that refills one buffer (``np.stack(samples,
out=buf); yield buf``) is still copied.

Rows, in µs per batch (construction and teardown included, as one epoch sees
them), interleaved within each repetition, for 1 MiB and 19 MB batches, with a
consumer that only waits and one that works (``np.multiply(b, 1.0001,
out=np.empty_like(b))``, which releases the GIL):

  plain loop                          no prefetcher
  thread + queue.Queue(4), no copy    the textbook prefetcher; unsafe in general
                                      (safe here only for the fresh source)
  prefetch, default                   Prefetcher(src, depth=4): fresh arrays handed over
  prefetch, copy="always"             every leaf copied into pooled memory
  prefetch, workers=2                 default, two copy threads

Targets: on the fresh source, prefetch is within 1.10 x the no-copy thread
prefetcher, and not slower than the plain loop when the consumer works; on the
refilled source, the default costs what copy="always" costs (nothing changes).
Minor page faults per batch are shown too: every row but the plain loop keeps
several batches alive at once, and a fresh 19 MB allocation per batch then
often comes from new pages (the allocator returns freed ones to the system).

A second table shows where the time of an overlapped run goes: producer and
consumer each sleep P = C = 2 ms per batch (releasing the GIL), N batches.
The total splits into N * max(P, C) with P and C as timed inside the run; the
first batch (nothing overlaps it: the pipeline fills, 1/(N+1) of the ideal);
the consumer's wake-ups (from the moment a batch was both produced and wanted
until next() returned it); and the rest (batches whose P ran longer than their
C, and the consumer's own per-batch cost). "sleep overshoot" is how much
longer time.sleep takes inside the run than alone: it makes an efficiency
against P and C timed alone look worse than the pipeline is.
"""
from __future__ import annotations

import resource
import time

import numpy as np

import _baselines as B
import _stats as S
import _util as U

TITLE = "Hand-over of fresh batches (no copy) vs copying"
PLAIN = "plain loop"
QUEUE = "thread + queue.Queue(4), no copy"
OURS = "prefetch, default"
ALWAYS = 'prefetch, copy="always"'
W2 = "prefetch, workers=2"
ROWS = [PLAIN, QUEUE, OURS, ALWAYS, W2]
QCOPY = "queue.Queue thread + np.copy"
MB, MiB = 10**6, 2**20
DEPTH = 4
SAMPLES = 16          # samples collated per batch
GOAL_QUEUE = 1.10     # fresh source: prefetch / no-copy thread prefetcher <= this
GOAL_PLAIN = 1.0      # fresh source, consumer works: prefetch / plain loop <= this
GOAL_SAME = 1.05      # refilled source (copied either way): default / copy="always" <= this


def add_arguments(g):
    g.add_argument("--handover-sizes", type=U.size_list, help="batch sizes (default 1m,19000k)")


def config(a):
    return {"sizes": a.handover_sizes or [1 * MiB, 19 * MB], "reps": a.reps or (9 if a.quick else 11),
            "target_s": 0.03 if a.quick else 0.15, "n_min": 30, "n_max": 2000,
            "overlap_n": [60] if a.quick else [60, 150]}


def _samples(nbytes):
    rng = np.random.default_rng(0)
    return [rng.random(max(1, nbytes // 8 // SAMPLES)) for _ in range(SAMPLES)]


def fresh_source(samples, n):
    """A new array per batch that nothing else references: handed over."""
    for _ in range(n):
        yield np.stack(samples)


def refilled_source(samples, n):
    """One buffer refilled in place per batch: must be copied."""
    buf = np.empty((len(samples), samples[0].size))
    for _ in range(n):
        np.stack(samples, out=buf)
        yield buf


def _work(b):
    np.multiply(b, 1.0001, out=np.empty_like(b))


def _make(row, src):
    import prefetch
    if row == PLAIN:
        return src
    if row == QUEUE:
        return B.QueuePrefetcher(src, DEPTH, copy=False)
    if row == OURS:
        return prefetch.Prefetcher(src, depth=DEPTH)
    if row == ALWAYS:
        return prefetch.Prefetcher(src, depth=DEPTH, copy="always")
    return prefetch.Prefetcher(src, depth=DEPTH, workers=2)


def time_row(row, source, samples, n, works):
    """(µs per batch over n batches, minor page faults per batch (the whole process),
    (leaves handed over, copied) or None)."""
    with U.no_gc():
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = U.ns()
        it = _make(row, source(samples, n))
        cnt = 0
        if works:
            for b in it:
                _work(b)
                cnt += 1
            del b
        else:
            for _b in it:
                cnt += 1
        t = U.ns() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    st = it.stats() if hasattr(it, "stats") else None
    B.close_quietly(it)
    if cnt != n:
        raise RuntimeError(f"{row}: expected {n} batches, got {cnt}")
    return t / n / 1e3, faults / n, (None if st is None else (st.leaves_handed_over, st.leaves_copied))


def _cases(cfg):
    return [(size, src, works) for size in cfg["sizes"] for src in ("fresh", "refilled")
            for works in (False, True)]


def _case_name(size, src, works):
    return f"{U.human_bytes(size)}, {src}, consumer {'works' if works else 'waits'}"


def overlap_breakdown(row, n, p_s=2e-3, c_s=2e-3):
    """Where the time of n overlapped batches goes, for one row (ms unless marked)."""
    import prefetch
    ready, got, done = [], [], []
    batch = (np.zeros((4, 8), np.float32), np.zeros(4, np.int64))
    t0 = U.ns()
    for _ in range(10):
        time.sleep(p_s)
    alone = (U.ns() - t0) / 10

    def src():
        for _ in range(n):
            time.sleep(p_s)
            ready.append(U.ns())
            yield batch

    with U.no_gc():
        t0 = U.ns()
        it = (B.QueuePrefetcher(src(), DEPTH, copy=True) if row == QCOPY
              else prefetch.Prefetcher(src(), depth=DEPTH))
        for _b in it:
            got.append(U.ns())
            time.sleep(c_s)
            done.append(U.ns())
        total = U.ns() - t0
    B.close_quietly(it)
    p_in = (ready[-1] - ready[0]) / (n - 1)
    c_in = sum(d - g for d, g in zip(done, got)) / n
    ideal = n * max(p_in, c_in)
    first = got[0] - t0
    wakes = sorted(got[i] - max(ready[i], done[i - 1]) for i in range(1, n))
    return {"efficiency, P and C timed alone": n * alone / total,
            "efficiency, P and C timed in the run": ideal / total,
            "best a pipeline of N can do": n / (n + 1),
            "first batch, ms": first / 1e6, "wake-ups, ms": sum(wakes) / 1e6,
            "wake-up median, µs": wakes[len(wakes) // 2] / 1e3,
            "rest, ms": (total - ideal - first - sum(wakes) + max(p_in, c_in)) / 1e6,
            "sleep overshoot, %": 100 * (p_in / alone - 1)}


def run(cfg, say):
    us, faults, counts, nbatches = {}, {}, {}, {}
    for size, srcname, works in _cases(cfg):
        name = _case_name(size, srcname, works)
        samples = _samples(size)
        source = fresh_source if srcname == "fresh" else refilled_source
        time_row(PLAIN, source, samples, 3, works)               # warm-up: page in, caches
        per = time_row(PLAIN, source, samples, 10, works)[0]
        n = int(min(cfg["n_max"], max(cfg["n_min"], cfg["target_s"] * 1e6 / per)))
        nbatches[name] = n
        us[name] = {r: [] for r in ROWS}
        faults[name] = {r: [] for r in ROWS}
        def unresolved(name=name):
            return _open({"us_per_batch": us}, name)

        for rep in S.repetitions(cfg, unresolved, say, f"{name}, repetition"):
            for row in U.rotate(ROWS, rep):
                t, f, c = time_row(row, source, samples, n, works)
                us[name][row].append(t)
                faults[name][row].append(f)
                if c is not None and row == OURS:
                    counts[name] = c
    breakdown = {}
    for n in cfg["overlap_n"]:
        breakdown[str(n)] = {row: [] for row in (QCOPY, OURS)}
        for rep in range(cfg["reps"]):
            say(f"overlap breakdown N={n}, repetition {rep + 1}/{cfg['reps']}")
            for row in U.rotate([QCOPY, OURS], rep):
                breakdown[str(n)][row].append(overlap_breakdown(row, n))
    data = {"sizes": cfg["sizes"], "n": nbatches, "us_per_batch": us, "faults_per_batch": faults,
            "handed_over_copied": counts,
            "overlap_breakdown": breakdown}
    return {"tables": _tables(data), "verdicts": _verdicts(data), "data": data}


def _ratio(data, case, a, b):
    return S.interval(S.ratios(data["us_per_batch"][case][a], data["us_per_batch"][case][b]))


def _targets(case):
    """(ours, other, goal) of the targets this case decides (at most `goal` x the other's time)."""
    out = []
    if ", fresh," in case:
        out.append((OURS, QUEUE, GOAL_QUEUE))
        if case.endswith("works"):
            out.append((OURS, PLAIN, GOAL_PLAIN))
    if ", refilled," in case:
        out.append((OURS, ALWAYS, GOAL_SAME))
    return out


def _open(data, case):
    """True while a target of this case is straddled by its interval."""
    return any(S.judge(_ratio(data, case, a, b), goal, higher_is_better=False) == S.INCONCLUSIVE
               for a, b, goal in _targets(case))


def plot(ax, data):
    cases = list(data["us_per_batch"])
    rows = [r for r in ROWS if r != PLAIN]
    width = 0.8 / len(rows)
    for j, r in enumerate(rows):
        ivs = [_ratio(data, c, r, PLAIN) for c in cases]
        ax.bar([i + (j - (len(rows) - 1) / 2) * width for i in range(len(cases))], [iv.median for iv in ivs],
               width, yerr=np.array([iv.errbar() for iv in ivs]).T, capsize=2, label=r)
    ax.axhline(GOAL_PLAIN, color="k", ls="--", lw=0.8,
               label=f"target: {OURS} <= {GOAL_PLAIN:g} x {PLAIN} (fresh batches, consumer works)")
    ax.set_xticks(range(len(cases)), [c.replace(", ", "\n", 1) for c in cases], fontsize=7)
    ax.set_ylabel(f"time per batch / {PLAIN}")
    ax.set_title("Hand-over of fresh batches vs copying, lower is better (median, bars: 95% interval)")


def _verdicts(data):
    cases = list(data["us_per_batch"])
    fresh = [c for c in cases if ", fresh," in c]
    works = [c for c in fresh if c.endswith("works")]
    refilled = [c for c in cases if ", refilled," in c]
    vq = {c: _ratio(data, c, OURS, QUEUE) for c in fresh}
    vp = {c: _ratio(data, c, OURS, PLAIN) for c in works}
    vr = {c: _ratio(data, c, OURS, ALWAYS) for c in refilled}
    worst = max(vq, key=lambda c: vq[c].median)
    worst_p = max(vp, key=lambda c: vp[c].median)
    worst_r = max(vr, key=lambda c: vr[c].median)
    return [
        S.Verdict(f"fresh batches: prefetch within {GOAL_QUEUE}x of a no-copy thread prefetcher",
                  f"worst {vq[worst].text()} ({worst})",
                  S.combine(S.judge(v, GOAL_QUEUE, higher_is_better=False) for v in vq.values()),
                  "; ".join(f"{c}: {v.text()}" for c, v in vq.items())),
        S.Verdict("fresh batches, consumer works: prefetch not slower than the plain loop",
                  f"worst {vp[worst_p].text()} ({worst_p})",
                  S.combine(S.judge(v, GOAL_PLAIN, higher_is_better=False) for v in vp.values()),
                  "; ".join(f"{c}: {v.text()}" for c, v in vp.items())),
        S.Verdict(f'refilled buffer: the default costs no more than copy="always" (within {GOAL_SAME}x)',
                  f"worst {vr[worst_r].text()} ({worst_r})",
                  S.combine(S.judge(v, GOAL_SAME, higher_is_better=False) for v in vr.values()),
                  "; ".join(f"{c}: {v.text()}" for c, v in vr.items())),
    ]


def _tables(data):
    lines = []
    for size in data["sizes"]:
        cs = [c for c in data["us_per_batch"] if c.startswith(U.human_bytes(size) + ",")]
        head = [f"{U.human_bytes(size)} batches: µs per batch, median [95% interval]"] + [
            c.split(", ", 1)[1] + f" (n={data['n'][c]})" for c in cs]
        tab = [[r] + [S.interval(data["us_per_batch"][c][r]).text(0) for c in cs] for r in ROWS]
        tab += [[f"ratio {a} / {b}"] + [_ratio(data, c, a, b).text() for c in cs]
                for a, b in ((OURS, QUEUE), (OURS, PLAIN), (OURS, ALWAYS), (W2, PLAIN))]
        tab += [[f"page faults per batch, {r}"] + [f"{float(np.median(data['faults_per_batch'][c][r])):.0f}"
                                                   for c in cs] for r in ROWS]
        tab += [["leaves handed over / copied, default"]
                + ["{} / {}".format(*data["handed_over_copied"].get(c, (0, 0))) for c in cs]]
        lines += U.table_lines(head, tab) + [""]
    for n, rows in data["overlap_breakdown"].items():
        keys = list(next(iter(rows.values()))[0])
        head = [f"overlap, sleep P = C = 2 ms, N = {n}, depth {DEPTH} (median)"] + list(rows)
        tab = [[k] + [f"{float(np.median([r[k] for r in reps])):.3f}" for reps in rows.values()]
               for k in keys]
        lines += U.table_lines(head, tab) + [""]
    return lines
