"""Section 4: peak RSS and steady-state allocations over a long run.

Each (row, size) runs in a fresh child process so that its peak RSS is its own.
The consumer reads every batch and drops it. Page faults per batch =
ru_minflt delta / batches over the second half of the run (ru_minflt counts the
whole process, background threads included); a second figure starts right after
a warm-up of 2*depth+8 batches, so one-time late pool growth is told apart. A buffer reused from a pool
faults nothing; a fresh allocation per batch faults every page on first touch
(glibc hands blocks >= 32 MiB straight back to the kernel on free, so every
large allocation comes back as new pages).

Run alone: python bench/bench_memory.py [--quick] [--sizes 4m,64m] [--batches 100]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U  # noqa: E402

REUSE = "np.copyto into one reused array (reference)"
FRESH = "np.empty + copy per batch"
QCOPY = "queue.Queue thread + np.copy"
OURS = "prefetch.Prefetcher"
ROWS = [REUSE, FRESH, QCOPY, OURS]
MiB = 2**20


def default_cfg(quick=False):
    if quick:
        plan = [[4 * MiB, 150], [64 * MiB, 40]]
    else:
        plan = [[1 * MiB, 3000], [16 * MiB, 400], [64 * MiB, 120], [256 * MiB, 40]]
    return {"plan": plan, "depth": 4, "timeout_s": 300}


# ---------------------------------------------------------------- child side

def _child(row, size, n, depth):
    rss0 = U.rss_bytes()
    src = np.arange(size // 4, dtype=np.float32)
    rss_src = U.rss_bytes()
    warm = min(n // 4, 2 * depth + 8)
    stats = None

    def src_iter():
        for _ in range(n):
            yield src

    if row == REUSE:
        dst = np.empty_like(src)

        def it_fn():
            for _ in range(n):
                np.copyto(dst, src)
                yield dst
        it = it_fn()
    elif row == FRESH:
        def it_fn():
            for _ in range(n):
                b = np.empty_like(src)
                np.copyto(b, src)
                yield b
        it = it_fn()
    elif row == QCOPY:
        it = U.QueuePrefetcher(src_iter(), depth, copy=True)
    elif row == OURS:
        prefetch, why = U.load_prefetch()
        if prefetch is None:
            return {"error": why}
        it = prefetch.Prefetcher(src_iter(), depth=depth)
    else:
        raise ValueError(row)
    rss_samples = []
    q = max(1, (n - warm) // 4)
    half = max(warm + 1, n // 2)
    acc = 0.0
    blocks_half = None
    with U.no_gc():
        for i, b in enumerate(it):
            acc += float(b[-1])  # the consumer reads the batch
            del b
            if i == warm:
                f0, t0, rss_warm = U.minflt(), U.ns(), U.rss_bytes()
            elif i > warm and (i - warm) % q == 0:
                rss_samples.append(U.rss_bytes())
            if i == half:
                fh = U.minflt()
                if hasattr(it, "stats"):
                    blocks_half = it.stats().blocks_allocated
        f1, t1, rss_end = U.minflt(), U.ns(), U.rss_bytes()
    if hasattr(it, "stats"):
        st = it.stats()
        stats = {k: getattr(st, k) for k in ("produced", "consumed", "blocks_allocated", "blocks_reused",
                                             "bytes_copied", "peak_fill") if hasattr(st, k)}
        if blocks_half is not None:
            stats["blocks_allocated_in_second_half"] = st.blocks_allocated - blocks_half
    U.close_quietly(it)
    steady = n - warm - 1
    return {
        "row": row, "size": size, "batches": n, "warmup": warm, "steady_batches": steady,
        # second half of the run: a pool that is still growing late shows up in
        # faults_after_warmup_per_batch, a per-batch cost in both
        "faults_per_batch": (f1 - fh) / (n - 1 - half),
        "faults_after_warmup_per_batch": (f1 - f0) / steady,
        "pages_per_batch": size / os.sysconf("SC_PAGE_SIZE"),
        "ms_per_batch": (t1 - t0) / steady / 1e6,
        "rss_base_mib": rss0 / MiB, "rss_with_source_mib": rss_src / MiB,
        "peak_rss_mib": U.maxrss_bytes() / MiB,
        "peak_over_source_batches": (U.maxrss_bytes() - rss_src) / size,
        "rss_growth_steady_mib": (rss_end - rss_warm) / MiB,
        "rss_samples_mib": [x / MiB for x in rss_samples],
        "stats": stats,
    }


# --------------------------------------------------------------- parent side

def _rows():
    prefetch, why = U.load_prefetch()
    rows = list(ROWS) if prefetch is not None else [r for r in ROWS if r != OURS]
    return rows, ({} if prefetch is not None else {OURS: why})


def steps(cfg):
    return len(cfg["plan"]) * len(_rows()[0])


def run(cfg, prog=None):
    prog = prog or U.NullProgress()
    rows, skipped = _rows()
    res = {"params": dict(cfg), "skipped": skipped, "results": {}}
    for size, n in cfg["plan"]:
        for row in rows:
            prog.set(f"memory {U.human_bytes(size)} x{n}: {row[:28]}")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", row, str(size), str(n), str(cfg["depth"])]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg["timeout_s"])
                if p.returncode != 0:
                    r = {"error": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
                else:
                    r = json.loads(p.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                r = {"error": f"timed out after {cfg['timeout_s']} s"}
            res["results"].setdefault(row, {})[str(size)] = r
            prog.tick()
    tgt = {}
    if OURS in res["results"]:
        f = {s: r.get("faults_per_batch") for s, r in res["results"][OURS].items()}
        ok = all(v is not None for v in f.values())
        # a pool that grows by a block late in the run (the consumer lagged once, so
        # the ring filled further than before) faults that block in once: bounded
        # growth (at most depth+2 blocks), not an allocation per batch
        late = {s: ((r.get("stats") or {}).get("blocks_allocated_in_second_half") or 0)
                for s, r in res["results"][OURS].items()}
        per_batch = {s: v is not None and (v < 1 or late[s] > 0) for s, v in f.items()}
        # "zero": below one page per batch (a stray page of Python objects is not an allocation per batch)
        tgt["zero_faults_steady_state"] = {"goal": "< 1 fault per batch", "by_size": f,
                                           "late_pool_blocks_by_size": late,
                                           "met": ok and all(per_batch.values())}
        fr = res["results"].get(FRESH, {})
        res["fresh_alloc_cost"] = {s: {"fresh_ms": fr.get(s, {}).get("ms_per_batch"),
                                       "ours_ms": res["results"][OURS][s].get("ms_per_batch")}
                                   for s in f}
    else:
        tgt["zero_faults_steady_state"] = {"goal": "< 1 fault per batch", "met": None, "why": skipped.get(OURS)}
    res["targets"] = tgt
    return res


def report(res):
    p = res["params"]
    out = [f"[4] Memory over a long run (one child process per cell; depth={p['depth']}; "
           "faults = ru_minflt per batch)."]
    header = ["row", "size x batches", "faults/batch", "(after warm-up)", "ms/batch", "peak RSS MiB",
              "peak-source /batch", "RSS growth MiB", "pool alloc/reused"]
    rows = []
    for size, n in p["plan"]:
        for row, by in res["results"].items():
            r = by.get(str(size), {})
            if "error" in r:
                rows.append([row, f"{U.human_bytes(size)} x{n}", "error: " + r["error"][:60], "", "", "", "", "", ""])
                continue
            st = r.get("stats") or {}
            pool = (f"{st['blocks_allocated']}/{st['blocks_reused']}"
                    if "blocks_allocated" in st and "blocks_reused" in st else "-")
            if st.get("blocks_allocated_in_second_half"):
                pool += f" ({st['blocks_allocated_in_second_half']} late)"
            rows.append([row, f"{U.human_bytes(size)} x{n}", f"{r['faults_per_batch']:.1f}",
                         f"{r['faults_after_warmup_per_batch']:.1f}", f"{r['ms_per_batch']:.3f}", f"{r['peak_rss_mib']:.0f}",
                         f"{r['peak_over_source_batches']:.1f}", f"{r['rss_growth_steady_mib']:+.1f}", pool])
    out += U.table_lines(header, rows)
    out.append("    faults/batch: minor page faults per batch over the second half of the run (steady state);")
    out.append("    (after warm-up): from batch 2*depth+8 on, so late one-time pool growth shows here only.")
    out.append("    'peak-source /batch': peak RSS above the source array, in batch sizes (buffers held at the peak).")
    out.append("    'k late': pool blocks first allocated in the second half (bounded one-time growth, faulted in once).")
    for k, why in res["skipped"].items():
        out.append(f"    (skipped {k}: {why})")
    return out


def _apply_options(cfg, given):
    if "sizes" in given:
        cfg["plan"] = [[s, given.get("batches", 100)] for s in given["sizes"]]
    elif "batches" in given:
        cfg["plan"] = [[s, given["batches"]] for s, _ in cfg["plan"]]
    if "depth" in given:
        cfg["depth"] = given["depth"]


def main(argv=None):
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        row, size, n, depth = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(_child(row, size, n, depth)))
        return
    U.section_main(__doc__, default_cfg, run, report, steps, argv=argv, apply=_apply_options,
                   options=[("sizes", U.size_list), ("batches", int), ("depth", int)])

if __name__ == "__main__":
    main()
