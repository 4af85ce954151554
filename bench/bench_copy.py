"""Section 2: copy throughput (GB/s) by batch size, next to the machine's limit.

The batch is one float32 array of the given size; the source hands out the same
array every time (a source that refills one buffer in place). The limit rows are
np.copyto into a preallocated array, on one thread and split in halves over two
threads (each thread copies its half N times with no per-batch sync: the best
two threads can do on this machine). "depth+2 dsts in turn" copies into as many
buffers as a prefetcher's pool cycles through: same cache footprint, no threads.
Prefetcher rows count every byte the
consumer received per second, hand-off included, in steady state (after a
warm-up of depth+2 batches, as the limit rows copy into an existing buffer).
"np.copy per batch" shows what
a fresh allocation per batch costs (page faults on first touch).

Run alone: python bench/bench_copy.py [--quick] [--sizes 64k,1m,16m] [--reps 5]
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U  # noqa: E402

LIM1 = "np.copyto 1 thread, reused dst (limit)"
LIM2 = "np.copyto 2 threads, halves (limit)"
ROT = "np.copyto 1 thread, depth+2 dsts in turn"
FRESH = "np.copy, fresh array per batch"
QCOPY = "queue.Queue thread + np.copy"
OURS1 = "prefetch.Prefetcher workers=1"
OURS2 = "prefetch.Prefetcher workers=2"

KiB, MiB = 2**10, 2**20


def default_cfg(quick=False):
    if quick:
        sizes = [64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
    else:
        sizes = [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    return {"sizes": sizes, "reps": 3 if quick else 5, "target_s": 0.05 if quick else 0.15,
            "n_min": 3, "n_max": 20000, "depth": 2, "target_min_size": 1 * MiB}


def _make_rows():
    rows = [LIM1, LIM2, ROT, FRESH, QCOPY]
    skipped = {}
    prefetch, why = U.load_prefetch()
    if prefetch is not None:
        rows += [OURS1, OURS2]
    else:
        skipped["prefetch.Prefetcher"] = why
    return rows, skipped, prefetch


def _copyto_1t(src, dst, n):
    with U.no_gc():
        t0 = U.ns()
        for _ in range(n):
            np.copyto(dst, src)
        return U.ns() - t0


_ROT = {}


def _copyto_rot(src, dsts, n):
    """Like a pool of depth+2 blocks used in turn: the same cache footprint as a prefetcher."""
    k = len(dsts)
    with U.no_gc():
        t0 = U.ns()
        for i in range(n):
            np.copyto(dsts[i % k], src)
        return U.ns() - t0


def _copyto_2t(src, dst, n):
    s = src.reshape(-1).view(np.uint8)
    d = dst.reshape(-1).view(np.uint8)
    h = s.size // 2
    parts = [(s[:h], d[:h]), (s[h:], d[h:])]
    go = threading.Barrier(3)
    done = []

    def work(a, b):
        go.wait()
        for _ in range(n):
            np.copyto(b, a)
        done.append(U.ns())

    ts = [threading.Thread(target=work, args=p) for p in parts]
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


def _src(a, n):
    for _ in range(n):
        yield a


def _steady(make, src, n, depth):
    """Time n batches after a warm-up of depth+2 batches (pool filled, threads up).

    The limit rows copy into a buffer that already exists, so the prefetcher
    rows are timed in the same steady state: construction and the pool's first
    allocations are not in the timing (bench_memory shows them).
    """
    warm = depth + 2
    it = make(_src(src, warm + n))
    with U.no_gc():
        for _ in range(warm):
            b = next(it)
        del b
        t0 = U.ns()
        cnt = 0
        for b in it:  # noqa: B007
            cnt += 1
        t = U.ns() - t0
    del b
    U.close_quietly(it)
    if cnt != n:
        raise RuntimeError(f"expected {n} batches, got {cnt}")
    return t


def _one(row, src, dst, n, depth, prefetch):
    if row == LIM1:
        return _copyto_1t(src, dst, n)
    if row == LIM2:
        return _copyto_2t(src, dst, n)
    if row == ROT:
        key = (id(src), depth)
        if key not in _ROT:  # made once per size, outside the timing
            _ROT.clear()
            _ROT[key] = [dst] + [np.copy(src) for _ in range(depth + 1)]
        return _copyto_rot(src, _ROT[key], n)
    if row == FRESH:
        return _fresh(src, n)
    if row == QCOPY:
        return _steady(lambda s: U.QueuePrefetcher(s, depth, copy=True), src, n, depth)
    w = 1 if row == OURS1 else 2
    return _steady(lambda s: prefetch.Prefetcher(s, depth=depth, workers=w), src, n, depth)


def steps(cfg):
    rows, _, _ = _make_rows()
    return len(cfg["sizes"]) * (len(rows) * cfg["reps"] + 1)


def run(cfg, prog=None):
    prog = prog or U.NullProgress()
    rows, skipped, prefetch = _make_rows()
    res = {"params": dict(cfg), "skipped": skipped, "rows": {r: {} for r in rows}, "ratios": {}, "n": {}}
    ratio_keys = []
    if prefetch is not None:
        ratio_keys = [(OURS1, LIM1), (OURS2, LIM2), (OURS2, LIM1)]
    for size in cfg["sizes"]:
        src = np.arange(size // 4, dtype=np.float32)
        src = src.reshape(-1, 256) if src.size % 256 == 0 else src
        dst = np.empty_like(src)
        np.copyto(dst, src)  # fault dst in before any timing
        prog.set(f"copy {U.human_bytes(size)}: calibrate")
        t1 = _copyto_1t(src, dst, 3) / 3
        n = int(cfg["target_s"] * 1e9 / max(t1, 1))
        n = max(cfg["n_min"], min(cfg["n_max"], n))
        # slow rows (small batches through a thread) get fewer batches, so one
        # measurement stays near target_s whatever the row costs per batch
        nrow = {}
        for row in rows:
            if row in (LIM1, LIM2, ROT):
                nrow[row] = n
                continue
            npilot = max(2, min(n, 20))
            per = _one(row, src, dst, npilot, cfg["depth"], prefetch) / npilot
            nrow[row] = max(cfg["n_min"], min(n, int(cfg["target_s"] * 1e9 / max(per, 1))))
        res["n"][str(size)] = nrow
        prog.tick()
        samples = {r: [] for r in rows}
        for rep in range(cfg["reps"]):
            for row in U.rotate(rows, rep + size):
                prog.set(f"copy {U.human_bytes(size)}: {row[:32]}")
                t = _one(row, src, dst, nrow[row], cfg["depth"], prefetch)
                samples[row].append(size * nrow[row] / t)  # bytes/ns == GB/s
                prog.tick()
        for row in rows:
            res["rows"][row][str(size)] = dict(U.summary(samples[row]), samples=samples[row])
        for a, b in ratio_keys:
            res["ratios"].setdefault(f"{a} / {b}", {})[str(size)] = U.summary(
                [x / y for x, y in zip(samples[a], samples[b])])
        _ROT.clear()
        del src, dst
    tgt = {}
    big = [s for s in cfg["sizes"] if s >= cfg["target_min_size"]]
    for key, (a, b) in (("copy_w1_vs_copyto_1t", (OURS1, LIM1)), ("copy_w2_vs_copyto_2t", (OURS2, LIM2))):
        r = res["ratios"].get(f"{a} / {b}")
        if not r or not big:
            tgt[key] = {"goal": ">= 0.9 for sizes >= 1 MiB", "met": None, "why": skipped.get("prefetch.Prefetcher")}
            continue
        worst = min(big, key=lambda s: r[str(s)]["median"])
        tgt[key] = {"goal": ">= 0.9 for sizes >= 1 MiB", "worst_size": worst,
                    "worst_ratio": r[str(worst)]["median"],
                    "by_size": {str(s): r[str(s)]["median"] for s in big},
                    "met": all(r[str(s)]["median"] >= 0.9 for s in big)}
    res["targets"] = tgt
    return res


def report(res):
    sizes = res["params"]["sizes"]
    out = [f"[2] Copy throughput, GB/s (1 GB = 1e9 B), median ±half-IQR; depth={res['params']['depth']}."]
    header = ["row"] + [U.human_bytes(s) for s in sizes]
    rows = [[r] + [U.fmt(res["rows"][r].get(str(s))) for s in sizes] for r in res["rows"]]
    out += U.table_lines(header, rows)
    if res["ratios"]:
        out.append("    ratios (median of per-repetition ratios):")
        rr = [[k] + [U.fmt(v.get(str(s)), 2, pct=False) for s in sizes] for k, v in res["ratios"].items()]
        out += ["    " + x for x in U.table_lines(["ours / limit"] + [U.human_bytes(s) for s in sizes], rr)]
    for k, why in res["skipped"].items():
        out.append(f"    (skipped {k}: {why})")
    return out


def main(argv=None):
    U.section_main(__doc__, default_cfg, run, report, steps, argv=argv,
                   options=[("sizes", U.size_list), ("reps", int), ("depth", int)])

if __name__ == "__main__":
    main()
