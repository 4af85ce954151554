"""Section 1: hand-off cost per tiny batch, by depth.

Every row consumes the same N tiny batches (a tuple of a 4x8 float32 and a
4-element int64 array, as a data loader hands out) from the same generator.
"extra cost per batch" = (row time - plain loop time) / N, measured in the same
repetition, so the source's own cost cancels out. Construction and thread start
are inside the timed region (amortised over N); close() is not.

Run alone: python bench/bench_handoff.py [--quick] [--depths 1,4,16] [--reps 5]
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U  # noqa: E402

PLAIN = "plain loop (no prefetch)"
QUEUE = "queue.Queue thread (no copy: unsafe)"
QUEUE_COPY = "queue.Queue thread + np.copy (naive safe)"
BG = "prefetch_generator.BackgroundGenerator (no copy)"
OURS = "prefetch.Prefetcher"
MX_PLAIN = "mx: plain DataIter loop"
MX_PF = "mx.io.PrefetchingIter (depth fixed at 1)"
MX_OURS = "prefetch.mx.PrefetchingIter"


def default_cfg(quick=False):
    return {
        "depths": [1, 4, 16] if quick else [1, 2, 4, 16, 64],
        "reps": 3 if quick else 7,
        "target_s": 0.06 if quick else 0.25,  # per measurement, sets N per row
        "n_min": 200 if quick else 300,
        "n_max": 20000 if quick else 100000,
        "target_depth": 4,
    }


def tiny_batch():
    return (np.arange(32, dtype=np.float32).reshape(4, 8), np.arange(4, dtype=np.int64))


def _source(batch, n):
    for _ in range(n):
        yield batch


def _rows(cfg):
    """[(name, group, factory(n, depth) -> iterator, by_depth)]."""
    batch = tiny_batch()
    rows = [(PLAIN, "np", lambda n, d: iter(_source(batch, n)), False),
            (QUEUE, "np", lambda n, d: U.QueuePrefetcher(_source(batch, n), d, copy=False), True),
            (QUEUE_COPY, "np", lambda n, d: U.QueuePrefetcher(_source(batch, n), d, copy=True), True)]
    skipped = {}
    BackgroundGenerator, why = U.load_bg()
    if BackgroundGenerator is not None:
        rows.append((BG, "np", lambda n, d: BackgroundGenerator(_source(batch, n), max_prefetch=d), True))
    else:
        skipped[BG] = why
    prefetch, why = U.load_prefetch()
    if prefetch is not None:
        rows.append((OURS, "np", lambda n, d: prefetch.Prefetcher(_source(batch, n), depth=d), True))
    else:
        skipped[OURS] = why
    mx, why = U.load_mx()
    if mx is not None and not cfg.get("no_mx"):
        rows.append((MX_PLAIN, "mx", lambda n, d: iter(U.mx_source_iter(mx, n, list(batch[:1]), batch[1])), False))
        rows.append((MX_PF, "mx", lambda n, d: mx.io.PrefetchingIter(U.mx_source_iter(mx, n, list(batch[:1]), batch[1])), False))
        try:
            import prefetch.mx as pmx
            rows.append((MX_OURS, "mx", lambda n, d: pmx.PrefetchingIter(
                U.mx_source_iter(mx, n, list(batch[:1]), batch[1]), depth=d), True))
        except Exception as e:
            skipped[MX_OURS] = f"prefetch.mx not importable ({type(e).__name__}: {str(e)[:80]})"
    else:
        skipped["mx.io.PrefetchingIter"] = why or "disabled"
    return rows, skipped


def _measure(make, n, depth):
    with U.no_gc():
        t0 = U.ns()
        it = make(n, depth)
        first = next(it)
        t1 = U.ns()
        cnt = 1
        for first in it:  # noqa: B007 - keep the last batch alive like a user loop does
            cnt += 1
        t2 = U.ns()
    U.close_quietly(it)
    del it, first
    if cnt != n:
        raise RuntimeError(f"expected {n} batches, got {cnt}")
    return (t2 - t0) / n / 1e3, (t1 - t0) / 1e3


def steps(cfg):
    rows, _ = _rows(cfg)
    per_rep = sum(len(cfg["depths"]) if by_depth or name in (PLAIN, MX_PLAIN) else 1
                  for name, _, _, by_depth in rows)
    return per_rep * cfg["reps"] + len(rows)  # + pilot runs


def run(cfg, prog=None):
    prog = prog or U.NullProgress()
    rows, skipped = _rows(cfg)
    depths = cfg["depths"]
    # pilot: pick N per row so one measurement takes about target_s
    nsel = {}
    for name, _, make, _ in rows:
        prog.set(f"handoff: pilot {name[:30]}")
        per, _ = _measure(make, 300, 4)
        n = int(cfg["target_s"] / max(per * 1e-6, 1e-9))
        nsel[name] = max(cfg["n_min"], min(cfg["n_max"], n))
        prog.tick()
    raw = {name: {d: {"per": [], "ttfi": []} for d in depths} for name, *_ in rows}
    for rep in range(cfg["reps"]):
        for d in U.rotate(depths, rep):
            for name, group, make, by_depth in U.rotate(rows, rep):
                if not by_depth and name == MX_PF and d != depths[0]:
                    continue  # mx's depth is fixed; measure it once per repetition
                prog.set(f"handoff d={d} {name[:34]}")
                per, ttfi = _measure(make, nsel[name], d)
                raw[name][d]["per"].append(per)
                raw[name][d]["ttfi"].append(ttfi)
                prog.tick()
    # mx.io.PrefetchingIter has one depth: copy its samples into every column
    if MX_PF in raw:
        for d in depths[1:]:
            raw[MX_PF][d] = raw[MX_PF][depths[0]]
    groups = {name: group for name, group, *_ in rows}
    res = {"params": dict(cfg), "n_per_row": nsel, "skipped": skipped,
           "batch": "tuple(float32[4,8], int64[4])", "rows": {}, "ratios": {}}
    for name in raw:
        base = PLAIN if groups[name] == "np" else MX_PLAIN
        res["rows"][name] = {"group": groups[name], "by_depth": {}}
        for d in depths:
            per = raw[name][d]["per"]
            extra = [a - b for a, b in zip(per, raw[base][d]["per"])]
            res["rows"][name]["by_depth"][str(d)] = {
                "per_batch_us": U.summary(per),
                "extra_us": U.summary(extra) if name != base else None,
                "ttfi_us": U.summary(raw[name][d]["ttfi"]),
                "samples_per_batch_us": per,
            }

    def extra_samples(name, d):
        base = PLAIN if groups[name] == "np" else MX_PLAIN
        return [a - b for a, b in zip(raw[name][d]["per"], raw[base][d]["per"])]

    if OURS in raw:
        for other in (QUEUE_COPY, QUEUE, BG, MX_PF):
            if other not in raw:
                continue
            res["ratios"][f"ours/{other}"] = {
                str(d): U.summary([a / b for a, b in zip(extra_samples(OURS, d), extra_samples(other, d)) if b > 0])
                for d in depths}
    td = cfg["target_depth"] if cfg["target_depth"] in depths else depths[len(depths) // 2]
    tgt = {}
    r = res["ratios"].get(f"ours/{QUEUE_COPY}", {}).get(str(td))
    if r:
        tgt["handoff_vs_naive_safe"] = {"goal": "<= 0.2", "depth": td, "ratio": r["median"],
                                        "met": r["median"] <= 0.2}
    r = res["ratios"].get(f"ours/{MX_PF}", {}).get(str(td))
    if r:
        tgt["handoff_vs_mx_prefetchingiter"] = {"goal": "<= 1/30 = 0.0333", "depth": td, "ratio": r["median"],
                                                "met": r["median"] <= 1 / 30}
    elif MX_PF not in raw:
        tgt["handoff_vs_mx_prefetchingiter"] = {"goal": "<= 1/30", "met": None,
                                                "why": skipped.get("mx.io.PrefetchingIter", "mxnet missing")}
    res["targets"] = tgt
    return res


def report(res):
    depths = res["params"]["depths"]
    out = [f"[1] Hand-off cost per tiny batch ({res['batch']}), µs per batch, copy included where the row copies.",
           "    'extra' = row minus its plain loop (same repetition); median ±half-IQR over repetitions."]
    header = ["row"] + [f"d={d} per" for d in depths] + [f"d={d} extra" for d in depths] + ["first item"]
    rows = []
    for name, r in res["rows"].items():
        bd = r["by_depth"]
        rows.append([name]
                    + [U.fmt(bd[str(d)]["per_batch_us"]) for d in depths]
                    + [U.fmt(bd[str(d)]["extra_us"]) if bd[str(d)]["extra_us"] else "-" for d in depths]
                    + [U.fmt(bd[str(depths[0])]["ttfi_us"], 0, pct=False)])
    out += U.table_lines(header, rows)
    if res["ratios"]:
        out.append("    ratio of extra cost, ours / other (median of per-repetition ratios):")
        rr = [[k.split("/", 1)[1]] + [U.fmt(v[str(d)], 3) for d in depths] for k, v in res["ratios"].items()]
        out += ["    " + x for x in U.table_lines(["vs"] + [f"d={d}" for d in depths], rr)]
    for k, why in res["skipped"].items():
        out.append(f"    (skipped {k}: {why})")
    return out


def main(argv=None):
    U.section_main(__doc__, default_cfg, run, report, steps, argv=argv,
                   options=[("depths", U.int_list), ("reps", int)])

if __name__ == "__main__":
    main()
