"""Copy throughput (GB/s, 1 GB = 1e9 B) by batch size, next to the machine's limit.

The batch is one float32 array; the source hands out the same array every time
(a source that refills one buffer in place, so a prefetcher must copy it). The
limit rows are np.copyto into a preallocated array, on one thread and split in
halves over two threads (no per-batch sync: the best two threads can do here).
Prefetcher rows count the bytes the consumer received per second, hand-off
included, in steady state: after a warm-up of depth+2 batches, as the limit
rows copy into a buffer that already exists. "np.copy, fresh array" shows what
a new allocation per batch costs (page faults on first touch).
"""
from __future__ import annotations

import threading

import _baselines as B
import _stats as S
import _util as U
import numpy as np

TITLE = "Copy throughput for large batches"

LIM1 = "np.copyto, 1 thread, reused array (limit)"
LIM2 = "np.copyto, 2 threads, halves (limit)"
FRESH = "np.copy, fresh array per batch"
QCOPY = "queue.Queue thread + np.copy"
OURS1 = "prefetch.Prefetcher workers=1"
OURS2 = "prefetch.Prefetcher workers=2"
ROWS = [LIM1, LIM2, FRESH, QCOPY, OURS1, OURS2]
KiB, MiB = 2**10, 2**20
TARGETS = [(OURS1, LIM1, "workers=1 copies at >= 0.9x one-thread np.copyto (batches >= 1 MiB)"),
           (OURS2, LIM2, "workers=2 copies at >= 0.9x two-thread np.copyto (batches >= 1 MiB)")]
GOAL, GOAL_MIN_SIZE = 0.9, 1 * MiB


def add_arguments(g):
    g.add_argument("--sizes", type=U.size_list, help="copy batch sizes, e.g. 64k,1m,16m,256m")


def config(a):
    # Quick mode measures what the targets say (batches >= 1 MiB) the way a full run does: the
    # same ~0.1 s per measurement, so a prefetcher's start and end weigh as little as there
    # (at 0.03 s they were a third of a 16 MiB measurement and quick ratios came out ~0.6 where
    # full runs measured ~1), with fewer sizes and repetitions instead.
    sizes = a.sizes or ([1 * MiB, 16 * MiB] if a.quick
                        else [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB])
    return {"sizes": sizes, "reps": a.reps or (6 if a.quick else 15),
            "target_s": 0.1, "n_min": 3, "n_max": 20000, "depth": 2}


def _copyto_1t(src, dst, n):
    with U.no_gc():
        t0 = U.ns()
        for _ in range(n):
            np.copyto(dst, src)
        return U.ns() - t0


def _copyto_2t(src, dst, n):
    s, d = src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8)
    h = s.size // 2
    go = threading.Barrier(3)
    done = []

    def work(a, b):
        go.wait()
        for _ in range(n):
            np.copyto(b, a)
        done.append(U.ns())

    ts = [threading.Thread(target=work, args=p) for p in ((s[:h], d[:h]), (s[h:], d[h:]))]
    for t in ts:
        t.start()
    with U.no_gc():
        go.wait()
        t0 = U.ns()
        for t in ts:
            t.join()
    return max(done) - t0


def _fresh(src, n):
    with U.no_gc():
        t0 = U.ns()
        for _ in range(n):
            b = np.copy(src)
            del b
        return U.ns() - t0


def _steady(it, n, warm):
    with U.no_gc():
        for _ in range(warm):
            b = next(it)
        del b
        t0 = U.ns()
        cnt = 0
        for _b in it:
            cnt += 1
        t = U.ns() - t0
    B.close_quietly(it)
    if cnt != n:
        raise RuntimeError(f"expected {n} batches, got {cnt}")
    return t


def _time(row, src, dst, n, depth):
    """ns for n batches of this row."""
    import prefetch
    if row == LIM1:
        return _copyto_1t(src, dst, n)
    if row == LIM2:
        return _copyto_2t(src, dst, n)
    if row == FRESH:
        return _fresh(src, n)
    warm = depth + 2
    gen = (src for _ in range(warm + n))
    if row == QCOPY:
        return _steady(B.QueuePrefetcher(gen, depth, copy=True), n, warm)
    return _steady(prefetch.Prefetcher(gen, depth=depth, workers=1 if row == OURS1 else 2), n, warm)


def run(cfg, say):
    gbs = {r: {} for r in ROWS}  # row -> size -> [GB/s per repetition]
    for size in cfg["sizes"]:
        src = np.arange(size // 4, dtype=np.float32)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # fault dst in before any timing
        nrow = {}
        for row in ROWS:  # pilot: N per row so one measurement takes about target_s
            per = _time(row, src, dst, 3, cfg["depth"]) / 3
            nrow[row] = max(cfg["n_min"], min(cfg["n_max"], int(cfg["target_s"] * 1e9 / max(per, 1))))
        def unresolved(size=size):   # a target at this size still straddled by its interval
            return size >= GOAL_MIN_SIZE and any(
                S.judge(S.interval(S.ratios(gbs[a][size], gbs[b][size])), GOAL, higher_is_better=True)
                == S.INCONCLUSIVE for a, b, _ in TARGETS)

        for rep in S.repetitions(cfg, unresolved, say, f"{U.human_bytes(size)}, repetition"):
            for row in U.rotate(ROWS, rep):
                gbs[row].setdefault(size, []).append(size * nrow[row] / _time(row, src, dst, nrow[row], cfg["depth"]))
        del src, dst
    sizes = cfg["sizes"]
    ratio = {(a, b): {s: S.interval(S.ratios(gbs[a][s], gbs[b][s])) for s in sizes}
             for a, b in ((OURS1, LIM1), (OURS2, LIM2), (QCOPY, LIM1))}
    verdicts = []
    big = [s for s in sizes if s >= GOAL_MIN_SIZE]
    for a, b, text in TARGETS:
        if not big:
            verdicts.append(S.Verdict(text, "n/a", S.NOT_RUN, "no size >= 1 MiB measured"))
            continue
        st = {s: S.judge(ratio[(a, b)][s], GOAL, higher_is_better=True) for s in big}
        worst = min(big, key=lambda s: ratio[(a, b)][s].median)
        verdicts.append(S.Verdict(text, f"worst ratio {ratio[(a, b)][worst].text(2)} at {U.human_bytes(worst)}",
                                  S.combine(st.values()),
                                  "; ".join(f"{U.human_bytes(s)}: {v}" for s, v in st.items())))
    lines = U.table_lines(["row, GB/s"] + [U.human_bytes(s) for s in sizes],
                          [[r] + [S.interval(gbs[r][s]).text(1) for s in sizes] for r in ROWS])
    lines += ["", "  throughput ratio to the limit (above 0.9: the target)"]
    lines += U.table_lines(["row / limit"] + [U.human_bytes(s) for s in sizes],
                           [[f"{a} / {b}"] + [iv[s].text(2) for s in sizes] for (a, b), iv in ratio.items()])
    data = {"sizes": sizes, "depth": cfg["depth"], "gbs": {r: {str(s): v for s, v in d.items()} for r, d in gbs.items()}}
    return {"tables": lines, "verdicts": verdicts, "data": data}


def plot(ax, data):
    sizes = data["sizes"]
    x = [s / MiB for s in sizes]
    for row, by in data["gbs"].items():
        ivs = [S.interval(by[str(s)]) for s in sizes]
        style = {LIM1: "k-", LIM2: "k--"}.get(row, "-o" if row.startswith("prefetch.") else ":s")
        ax.plot(x, [iv.median for iv in ivs], style, lw=2.2 if row.startswith("prefetch.") else 1.2, label=row)
    for lim, style in ((LIM1, ":"), (LIM2, "-.")):
        if lim in data["gbs"]:
            ax.plot(x, [GOAL * S.interval(data["gbs"][lim][str(s)]).median for s in sizes], style, lw=1,
                    label=f"target: {GOAL:g} x {lim}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [U.human_bytes(s).replace(" ", "") for s in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("GB/s received by the consumer")
    ax.set_title("Copy throughput vs np.copyto limits, higher is better (median)")
