"""Section 3: overlap efficiency = N * max(P, C) / total time.

The producer spends P seconds per batch, the consumer C. Perfect overlap gives
1.0; no overlap gives max(P, C) / (P + C) (0.5 when P == C). P and C are
measured alone in the same repetition; a second figure uses P and C as timed
inside the run itself (so load from other processes cancels out). Work kinds:
  sleep   time.sleep (releases the GIL)
  numpy   np.sin over a cache-resident array (releases the GIL; on 2 cores the
          copy thread then competes with both sides for the CPUs)
  python  a pure-Python loop (holds the GIL; CPython switches threads every
          sys.getswitchinterval() s, so it cannot overlap with other Python work)
The "two bare threads" row runs the same P and C work on two threads with no
hand-off at all: what this machine allows for that pair of workloads.

Run alone: python bench/bench_overlap.py [--quick] [--reps 3]
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U  # noqa: E402

PLAIN = "plain loop (no prefetch)"
BARE = "two bare threads, no hand-off (limit)"
QCOPY = "queue.Queue thread + np.copy"
BG = "prefetch_generator.BackgroundGenerator"
OURS = "prefetch.Prefetcher"

# (case name, producer kind, P ms, consumer kind, C ms, releases GIL on both sides)
CASES_FULL = [
    ("sleep P=C=2ms", "sleep", 2.0, "sleep", 2.0, True),
    ("sleep P=2ms C=1ms", "sleep", 2.0, "sleep", 1.0, True),
    ("sleep P=1ms C=2ms", "sleep", 1.0, "sleep", 2.0, True),
    ("numpy P=C=2ms", "numpy", 2.0, "numpy", 2.0, True),
    ("python P=2ms, sleep C=2ms", "python", 2.0, "sleep", 2.0, False),
    ("python P=2ms, python C=2ms", "python", 2.0, "python", 2.0, False),
]


def default_cfg(quick=False):
    cases = CASES_FULL if not quick else [CASES_FULL[0], CASES_FULL[3], CASES_FULL[4], CASES_FULL[5]]
    return {"cases": [list(c) for c in cases], "n": 60 if quick else 150, "reps": 2 if quick else 4,
            "depth": 4}


# ----------------------------------------------------------------- work kinds

_NP = np.linspace(0.0, 1.0, 16384)  # 128 KiB: stays in L2, so the work is compute-bound
_NP_OUT = {}


def _calibrate_units():
    """How many inner units make 1 ms, per kind (numpy and python)."""
    out = {}
    buf = np.empty_like(_NP)
    # numpy: np.sin over 16K doubles, GIL released inside the ufunc loop
    for _ in range(20):  # warm up (page in, frequency ramp)
        np.sin(_NP, out=buf)
    k = 100
    t0 = time.perf_counter()
    for _ in range(k):
        np.sin(_NP, out=buf)
    out["numpy"] = k / ((time.perf_counter() - t0) * 1e3)
    # python: a counted loop that never releases the GIL on its own
    _py_loop(100000)
    k = 1000000
    t0 = time.perf_counter()
    _py_loop(k)
    out["python"] = k / ((time.perf_counter() - t0) * 1e3)
    return out


def _py_loop(k):
    x = 0
    for i in range(k):
        x += i
    return x


def _worker(kind, ms, units):
    if kind == "sleep":
        s = ms / 1e3
        return lambda: time.sleep(s)
    if kind == "numpy":
        k = max(1, round(ms * units["numpy"]))
        buf = np.empty_like(_NP)

        def f():
            for _ in range(k):
                np.sin(_NP, out=buf)
        return f
    if kind == "python":
        k = max(1, round(ms * units["python"]))
        return lambda: _py_loop(k)
    raise ValueError(kind)


def _source(produce, n, batch, spent):
    for _ in range(n):
        t0 = U.ns()
        produce()
        spent[0] += U.ns() - t0
        yield batch


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
    rows = [PLAIN, BARE, QCOPY]
    skipped = {}
    bg, why = U.load_bg()
    if bg is not None:
        rows.append(BG)
    else:
        skipped[BG] = why
    prefetch, why = U.load_prefetch()
    if prefetch is not None:
        rows.append(OURS)
    else:
        skipped[OURS] = why
    return rows, skipped, bg, prefetch


def _run_row(row, produce, consume, n, depth, bg, prefetch):
    if row == BARE:
        return _bare(produce, consume, n), None, None
    batch = (np.zeros((4, 8), np.float32), np.zeros(4, np.int64))
    spent = [0, 0]  # ns inside produce() and consume() during this very run
    src = _source(produce, n, batch, spent)
    with U.no_gc():
        t0 = U.ns()
        if row == PLAIN:
            it = src
        elif row == QCOPY:
            it = U.QueuePrefetcher(src, depth, copy=True)
        elif row == BG:
            it = bg(src, max_prefetch=depth)
        else:
            it = prefetch.Prefetcher(src, depth=depth)
        cnt = 0
        for _b in it:
            t1 = U.ns()
            consume()
            spent[1] += U.ns() - t1
            cnt += 1
        t = U.ns() - t0
    U.close_quietly(it)
    if cnt != n:
        raise RuntimeError(f"expected {n} batches, got {cnt}")
    return t, spent[0] / n, spent[1] / n


def steps(cfg):
    rows, _, _, _ = _rows()
    return len(cfg["cases"]) * cfg["reps"] * (len(rows) + 1)


def run(cfg, prog=None):
    prog = prog or U.NullProgress()
    rows, skipped, bg, prefetch = _rows()
    units = _calibrate_units()
    n, depth = cfg["n"], cfg["depth"]
    res = {"params": dict(cfg), "units_per_ms": units, "skipped": skipped, "cases": {}}
    for case in cfg["cases"]:
        name, pk, pms, ck, cms, releases = case
        produce, consume = _worker(pk, pms, units), _worker(ck, cms, units)
        eff = {r: [] for r in rows}
        eff_in = {r: [] for r in rows}
        secs = {r: [] for r in rows}
        pc = []
        for rep in range(cfg["reps"]):
            prog.set(f"overlap {name}: alone")
            na = max(5, n // 4)
            p, c = _alone(produce, na), _alone(consume, na)
            pc.append((p, c))
            prog.tick()
            for row in U.rotate(rows, rep):
                prog.set(f"overlap {name}: {row[:30]}")
                t, p_in, c_in = _run_row(row, produce, consume, n, depth, bg, prefetch)
                eff[row].append(n * max(p, c) / t)
                if p_in is not None:
                    # the same ratio with P and C as they took during this run: robust to
                    # load from other processes (it slows the work and the total alike)
                    eff_in[row].append(n * max(p_in, c_in) / t)
                secs[row].append(t / 1e9)
                prog.tick()
        p_ms = U.summary([x[0] / 1e6 for x in pc])
        c_ms = U.summary([x[1] / 1e6 for x in pc])
        res["cases"][name] = {
            "producer": pk, "consumer": ck, "P_ms": p_ms, "C_ms": c_ms, "both_release_gil": releases,
            "no_overlap_efficiency": max(p_ms["median"], c_ms["median"]) / (p_ms["median"] + c_ms["median"]),
            # the first batch's P (or the last batch's C) can never overlap
            "pipeline_best_efficiency": n * max(p_ms["median"], c_ms["median"])
            / (n * max(p_ms["median"], c_ms["median"]) + min(p_ms["median"], c_ms["median"])),
            "rows": {r: {"efficiency": U.summary(eff[r]), "efficiency_inrun": U.summary(eff_in[r]),
                         "total_s": U.summary(secs[r]), "samples": eff[r]}
                     for r in rows},
        }
    tgt = {}
    if OURS in rows:
        rel = {k: v["rows"][OURS]["efficiency"]["median"] for k, v in res["cases"].items() if v["both_release_gil"]}
        if rel:
            worst = min(rel, key=rel.get)
            lim = {k: res["cases"][k]["rows"][BARE]["efficiency"]["median"] for k in rel}
            inrun = {k: res["cases"][k]["rows"][OURS]["efficiency_inrun"]["median"] for k in rel}
            tgt["overlap_gil_released"] = {"goal": ">= 0.97", "by_case": rel, "worst_case": worst,
                                           "worst": rel[worst], "met": rel[worst] >= 0.97,
                                           "bare_threads_limit_by_case": lim,
                                           "inrun_by_case": inrun, "inrun_worst": min(inrun.values()),
                                           "pipeline_best_by_case": {k: res["cases"][k]["pipeline_best_efficiency"]
                                                                     for k in rel}}
    else:
        tgt["overlap_gil_released"] = {"goal": ">= 0.97", "met": None, "why": skipped.get(OURS)}
    res["targets"] = tgt
    return res


def report(res):
    cases = list(res["cases"])
    p = res["params"]
    out = [f"[3] Overlap efficiency N*max(P,C)/total (1.0 = perfect; N={p['n']}, depth={p['depth']}), median ±half-IQR."]
    header = ["row"] + cases
    rows = [["P / C measured alone, ms"] + [f"{res['cases'][c]['P_ms']['median']:.2f} / {res['cases'][c]['C_ms']['median']:.2f}"
                                            for c in cases],
            ["(no overlap would give)"] + [f"{res['cases'][c]['no_overlap_efficiency']:.2f}" for c in cases],
            ["(perfect pipeline of N gives)"] + [f"{res['cases'][c]['pipeline_best_efficiency']:.3f}" for c in cases]]
    names = list(res["cases"][cases[0]]["rows"]) if cases else []
    for r in names:
        rows.append([r] + [U.fmt(res["cases"][c]["rows"][r]["efficiency"], 3) for c in cases])
    out += U.table_lines(header, rows)
    out.append("    same, with P and C as timed inside each run (robust to load from other processes):")
    rows = [[r] + [U.fmt(res["cases"][c]["rows"][r].get("efficiency_inrun"), 3) for c in cases]
            for r in names if res["cases"][cases[0]]["rows"][r].get("efficiency_inrun")]
    out += ["    " + x for x in U.table_lines(["row"] + cases, rows)]
    for k, why in res["skipped"].items():
        out.append(f"    (skipped {k}: {why})")
    return out


def main(argv=None):
    U.section_main(__doc__, default_cfg, run, report, steps, argv=argv,
                   options=[("n", int), ("reps", int), ("depth", int)])

if __name__ == "__main__":
    main()
