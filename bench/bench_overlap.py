"""Overlap: N batches whose producer spends P and consumer C per batch should
take close to N * max(P, C), not N * (P + C).

Efficiency = N * max(P, C) / total time: 1.0 is perfect overlap, no overlap
gives max(P, C) / (P + C) (0.5 when P == C). P and C are timed alone in the same
repetition as the rows. Kinds of work:
  sleep   time.sleep (releases the GIL)
  numpy   np.sin over a cache-resident array (releases the GIL; on 2 cores the
          prefetch thread then competes with both sides for the CPUs)
  python  a pure-Python loop (holds the GIL)
When producer and consumer both hold the GIL, no overlap is possible: CPython
runs one of them at a time, so that case is stated, not measured.
"two bare threads" runs the same work on two threads with no hand-off at all:
what this machine allows for that pair.
"""
from __future__ import annotations

import threading
import time

import _baselines as B
import _stats as S
import _util as U
import numpy as np

TITLE = "Overlap of producer and consumer work"

PLAIN = "plain loop (no prefetching)"
BARE = "two bare threads, no hand-off (limit)"
QCOPY = "queue.Queue thread + np.copy"
BG = "prefetch_generator.BackgroundGenerator"
OURS = "prefetch.Prefetcher"
GOAL = 0.97
GIL_KINDS = {"python"}

# (case, producer kind, P ms, consumer kind, C ms)
CASES = [("sleep P=C=2ms", "sleep", 2.0, "sleep", 2.0),
         ("sleep P=2ms C=1ms", "sleep", 2.0, "sleep", 1.0),
         ("sleep P=1ms C=2ms", "sleep", 1.0, "sleep", 2.0),
         ("numpy P=C=2ms", "numpy", 2.0, "numpy", 2.0),
         ("python P=2ms, sleep C=2ms", "python", 2.0, "sleep", 2.0),
         ("python P=2ms, python C=2ms", "python", 2.0, "python", 2.0)]
QUICK = ["sleep P=C=2ms", "numpy P=C=2ms", "python P=2ms, sleep C=2ms", "python P=2ms, python C=2ms"]


def add_arguments(g):
    g.add_argument("--overlap-batches", type=int, help="batches per overlap run (N)")


def config(a):
    cases = [list(c) for c in CASES if not a.quick or c[0] in QUICK]
    return {"cases": cases, "n": a.overlap_batches or (100 if a.quick else 150),
            "reps": a.reps or (9 if a.quick else 11), "depth": 4}


_NP = np.linspace(0.0, 1.0, 16384)  # 128 KiB: stays in L2, so the work is compute-bound


def _py_loop(k):
    x = 0
    for i in range(k):
        x += i
    return x


def _units_per_ms():
    """How many inner units make 1 ms, for numpy and python work."""
    buf = np.empty_like(_NP)
    for _ in range(20):
        np.sin(_NP, out=buf)
    t0 = time.perf_counter()
    for _ in range(100):
        np.sin(_NP, out=buf)
    out = {"numpy": 100 / ((time.perf_counter() - t0) * 1e3)}
    _py_loop(100000)
    t0 = time.perf_counter()
    _py_loop(1000000)
    out["python"] = 1000000 / ((time.perf_counter() - t0) * 1e3)
    return out


def _work(kind, ms, units):
    if kind == "sleep":
        return lambda: time.sleep(ms / 1e3)
    k = max(1, round(ms * units[kind]))
    if kind == "numpy":
        buf = np.empty_like(_NP)

        def f():
            for _ in range(k):
                np.sin(_NP, out=buf)
        return f
    return lambda: _py_loop(k)


def _alone(f, n):
    with U.no_gc():
        t0 = U.ns()
        for _ in range(n):
            f()
        return (U.ns() - t0) / n


def _bare(produce, consume, n):
    def loop(f):
        for _ in range(n):
            f()
    t = threading.Thread(target=loop, args=(produce,))
    with U.no_gc():
        t0 = U.ns()
        t.start()
        loop(consume)
        t.join()
        return U.ns() - t0


def _rows():
    rows, skipped = [PLAIN, BARE, QCOPY], {}
    bg, why = B.load_bg()
    if bg is not None:
        rows.append(BG)
    else:
        skipped[BG] = why
    return rows + [OURS], skipped, bg


def _total_ns(row, produce, consume, n, depth, bg):
    import prefetch
    if row == BARE:
        return _bare(produce, consume, n)
    batch = (np.zeros((4, 8), np.float32), np.zeros(4, np.int64))

    def src():
        for _ in range(n):
            produce()
            yield batch
    with U.no_gc():
        t0 = U.ns()
        it = {PLAIN: lambda: src(), QCOPY: lambda: B.QueuePrefetcher(src(), depth, copy=True),
              BG: lambda: bg(src(), max_prefetch=depth),
              OURS: lambda: prefetch.Prefetcher(src(), depth=depth)}[row]()
        cnt = 0
        for _b in it:
            consume()
            cnt += 1
        t = U.ns() - t0
    B.close_quietly(it)
    if cnt != n:
        raise RuntimeError(f"expected {n} batches, got {cnt}")
    return t


def run(cfg, say):
    rows, skipped, bg = _rows()
    units = _units_per_ms()
    n, depth = cfg["n"], cfg["depth"]
    eff, pc, gil_bound = {}, {}, []
    for name, pk, pms, ck, cms in cfg["cases"]:
        if pk in GIL_KINDS and ck in GIL_KINDS:
            gil_bound.append(name)
            continue
        produce, consume = _work(pk, pms, units), _work(ck, cms, units)
        eff[name] = {r: [] for r in rows}
        pc[name] = []
        for rep in range(cfg["reps"]):
            say(f"{name}, repetition {rep + 1}/{cfg['reps']}")
            p, c = _alone(produce, max(5, n // 5)), _alone(consume, max(5, n // 5))
            pc[name].append((p / 1e6, c / 1e6))
            for row in U.rotate(rows, rep):
                eff[name][row].append(n * max(p, c) / _total_ns(row, produce, consume, n, depth, bg))
    free = [c[0] for c in cfg["cases"] if c[1] not in GIL_KINDS and c[3] not in GIL_KINDS]
    st = {c: S.judge(S.interval(eff[c][OURS]), GOAL, higher_is_better=True) for c in free}
    worst = min(free, key=lambda c: S.interval(eff[c][OURS]).median) if free else None
    verdicts = [S.Verdict(f"overlap efficiency >= {GOAL} when producer and consumer release the GIL",
                          f"worst {S.interval(eff[worst][OURS]).text(3)} ({worst})" if worst else "n/a",
                          S.combine(st.values()),
                          "; ".join(f"{c}: {v} (two bare threads reach {S.interval(eff[c][BARE]).median:.3f} here)"
                                    for c, v in st.items()))]
    cases = list(eff)
    p_c = {c: (float(np.median([x[0] for x in pc[c]])), float(np.median([x[1] for x in pc[c]]))) for c in cases}
    # the first batch's P (or the last batch's C) can never overlap
    best = {c: n * max(p_c[c]) / (n * max(p_c[c]) + min(p_c[c])) for c in cases}
    tab = [["P / C timed alone, ms"] + [f"{p_c[c][0]:.2f} / {p_c[c][1]:.2f}" for c in cases],
           ["(best a pipeline of N can do)"] + [f"{best[c]:.3f}" for c in cases]]
    tab += [[r] + [S.interval(eff[c][r]).text(3) for c in cases] for r in rows]
    lines = U.table_lines([f"row, efficiency (N={n}, depth={depth})"] + cases, tab)
    lines += [f"  {c}: no overlap is possible (producer and consumer both hold the GIL); not measured."
              for c in gil_bound]
    lines += [f"  (not measured: {k}: {why})" for k, why in skipped.items()]
    return {"tables": lines, "verdicts": verdicts,
            "data": {"n": n, "cases": cases, "efficiency": eff, "gil_bound": gil_bound, "pipeline_best": best}}


def plot(ax, data):
    cases, eff = data["cases"], data["efficiency"]
    rows = list(eff[cases[0]]) if cases else []
    w = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        ivs = [S.interval(eff[c][r]) for c in cases]
        med = [iv.median for iv in ivs]
        ax.bar([j + (i - (len(rows) - 1) / 2) * w for j in range(len(cases))], med, w,
               yerr=np.array([iv.errbar() for iv in ivs]).T, capsize=2, label=r)
    ax.axhline(GOAL, color="k", lw=0.8, ls="--", label=f"target {GOAL}")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":", label="no overlap (cases with P = C)")
    ax.set_xticks(range(len(cases)), [c.replace(", ", "\n").replace(" P", "\nP") for c in cases], fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("N·max(P,C) / total time")
    title = "Overlap efficiency, 1.0 = perfect (median, bars: 95% interval)"
    if data["gil_bound"]:
        title += "\nnot shown: " + ", ".join(data["gil_bound"]) + " (both hold the GIL: no overlap possible)"
    ax.set_title(title, fontsize=10)
