"""Page faults per batch in steady state, and peak memory, over a long run.

Each (row, size) runs in a fresh child process, so its fault count and peak RSS
are its own. The consumer reads every batch and drops it. Steady state starts
after a warm-up of 2 x (depth + 2) + 4 batches (the pool keeps at most
2 x (depth + 2) blocks); the rest of the run is cut into windows, and faults
per batch (ru_minflt, whole process) are counted over the windows in which the
pool did not grow (a window with a new pool block, and the one after it, are
left out: that block faults in once). Pool growth is bounded separately: more
blocks than the pool keeps means an allocation per batch, and fails.
A reused buffer faults nothing; a fresh allocation per batch faults every page
(glibc returns blocks >= 32 MiB to the kernel on free).
"""
from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys

import _baselines as B
import _stats as S
import _util as U
import numpy as np

TITLE = "Page faults per batch in steady state"

REUSE = "np.copyto into one reused array (reference)"
FRESH = "np.empty + copy per batch"
QCOPY = "queue.Queue thread + np.copy"
OURS = "prefetch.Prefetcher"
ROWS = [REUSE, FRESH, QCOPY, OURS]
MiB = 2**20
BOUND = 1.0  # faults per batch: a stray page of Python objects is not an allocation per batch
WINDOWS = 8


def add_arguments(g):
    g.add_argument("--memory-sizes", type=U.size_list, help="batch sizes of the page-fault runs, e.g. 4m,64m")
    g.add_argument("--memory-batches", type=int, help="batches per page-fault run")


def config(a):
    plan = [[4 * MiB, 200], [64 * MiB, 60]] if a.quick else [[1 * MiB, 3000], [16 * MiB, 400], [64 * MiB, 160],
                                                             [256 * MiB, 60]]
    if a.memory_sizes:
        plan = [[s, a.memory_batches or 200] for s in a.memory_sizes]
    elif a.memory_batches:
        plan = [[s, a.memory_batches] for s, _ in plan]
    return {"plan": plan, "depth": 4, "timeout_s": 300}


def _minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss():
    """VmHWM: ru_maxrss survives exec, so in a child it would report the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _child(row, size, n, depth):
    src = np.arange(size // 4, dtype=np.float32)
    rss_src = _rss()
    warm = 2 * (depth + 2) + 4
    if n < warm + 2 * WINDOWS:
        raise ValueError(f"batches must be >= {warm + 2 * WINDOWS} for depth {depth}, got {n}")
    w = (n - warm) // WINDOWS
    src_iter = (src for _ in range(n))
    if row == REUSE:
        dst = np.empty_like(src)
        it = (np.copyto(dst, s) or dst for s in src_iter)  # copyto returns None: hand out dst
    elif row == FRESH:
        it = (np.copy(s) for s in src_iter)
    elif row == QCOPY:
        it = B.QueuePrefetcher(src_iter, depth, copy=True)
    else:
        import prefetch
        it = prefetch.Prefetcher(src_iter, depth=depth)
    blocks = (lambda: it.stats().blocks_allocated) if row == OURS else (lambda: 0)
    marks = []  # (batch index, minflt, blocks allocated, ns) at each window boundary
    acc = 0.0
    with U.no_gc():
        for i, b in enumerate(it):
            acc += float(b[-1])  # the consumer reads the batch
            del b
            if i >= warm and (i - warm) % w == 0 and len(marks) <= WINDOWS:
                marks.append((i, _minflt(), blocks(), U.ns()))
    B.close_quietly(it)
    used_faults = used_batches = 0
    skip_next = False
    for (i0, f0, b0, _), (i1, f1, b1, _) in itertools.pairwise(marks):
        grew = b1 > b0
        if not grew and not skip_next:
            used_faults += f1 - f0
            used_batches += i1 - i0
        skip_next = grew  # a block counted at a boundary may fault in just after it
    steady = marks[-1][0] - marks[0][0]
    return {"faults_per_batch": used_faults / used_batches if used_batches else None,
            "batches_counted": used_batches, "steady_batches": steady,
            "pool_blocks": blocks(), "pool_growth_after_warmup": marks[-1][2] - marks[0][2],
            "ms_per_batch": (marks[-1][3] - marks[0][3]) / steady / 1e6,
            "peak_over_source_batches": (_peak_rss() - rss_src) / size}


def run(cfg, say):
    depth = cfg["depth"]
    res = {}
    for size, n in cfg["plan"]:
        for row in ROWS:
            say(f"{U.human_bytes(size)} x {n}: {row}")
            cmd = [sys.executable, os.path.abspath(__file__), row, str(size), str(n), str(depth)]
            try:
                p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=cfg["timeout_s"])
                r = (json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0
                     else {"error": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"})
            except subprocess.TimeoutExpired:
                r = {"error": f"timed out after {cfg['timeout_s']} s"}
            res.setdefault(row, {})[str(size)] = r
    pool_bound = 2 * (depth + 2)
    st, worst = {}, None
    for size, _ in cfg["plan"]:
        r = res[OURS][str(size)]
        f = r.get("faults_per_batch")
        if "error" in r:
            st[size] = S.NOT_RUN
        elif r["pool_blocks"] > pool_bound:
            st[size] = S.MISSED  # the pool kept allocating: growth per batch, not a one-time fill
        elif f is None or r["batches_counted"] < r["steady_batches"] / 2:
            st[size] = S.INCONCLUSIVE  # the pool grew in most windows: too little steady state to count
        else:
            st[size] = S.MET if f <= BOUND else S.MISSED
        if f is not None and (worst is None or f > res[OURS][str(worst)]["faults_per_batch"]):
            worst = size
    measured = (f"worst {res[OURS][str(worst)]['faults_per_batch']:.2f} faults per batch at {U.human_bytes(worst)}"
                if worst else "n/a")
    verdicts = [S.Verdict(f"steady state allocates nothing: <= {BOUND:g} page fault per batch", measured,
                          S.combine(st.values()), "; ".join(f"{U.human_bytes(s)}: {v}" for s, v in st.items()))]
    tab = []
    for size, n in cfg["plan"]:
        for row in ROWS:
            r = res[row][str(size)]
            if "error" in r:
                tab.append([row, f"{U.human_bytes(size)} x {n}", "error: " + r["error"][:70]] + [""] * 4)
                continue
            f = r["faults_per_batch"]
            tab.append([row, f"{U.human_bytes(size)} x {n}", "n/a" if f is None else f"{f:.2f}",
                        f"{r['batches_counted']}/{r['steady_batches']}",
                        str(r["pool_growth_after_warmup"]) if row == OURS else "-",
                        f"{r['ms_per_batch']:.3f}", f"{r['peak_over_source_batches']:.1f}"])
    lines = U.table_lines(["row", "batch x count", "faults/batch", "batches counted", "pool growth",
                           "ms/batch", "peak memory, batches"], tab)
    lines += ["  faults/batch: minor page faults per batch in steady state (windows where the pool did not grow);",
              "  pool growth: blocks the prefetcher's pool added after the warm-up (each faults in once);",
              "  peak memory: peak resident memory above the source array, in batch sizes."]
    return {"tables": lines, "verdicts": verdicts, "data": {"plan": cfg["plan"], "depth": depth, "results": res}}


def plot(ax, data):
    sizes = [s for s, _ in data["plan"]]
    rows = list(data["results"])
    w = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ys = [data["results"][r][str(s)].get("faults_per_batch") or 0 for s in sizes]
        bars = ax.bar([j + (i - (len(rows) - 1) / 2) * w for j in range(len(sizes))], ys, w, label=r)
        ax.bar_label(bars, [f"{y:.2g}" for y in ys], fontsize=7)  # a zero bar is invisible on its own
    ax.axhline(BOUND, color="k", lw=0.8, ls="--", label=f"bound: {BOUND:g} fault per batch")
    ax.set_xticks(range(len(sizes)), [U.human_bytes(s) for s in sizes])
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(0, max(10, ax.get_ylim()[1] * 3))  # room for the labels
    ax.set_xlabel("batch size")
    ax.set_ylabel("minor page faults per batch")
    ax.set_title("Page faults per batch in steady state, lower is better")


if __name__ == "__main__":  # one child run: ROW SIZE BATCHES DEPTH -> one JSON line
    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
