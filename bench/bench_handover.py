"""Section: hand-over vs copy (issue 13, SPEC §3 rule 1 and §7 "never slower").

A loader that collates a fresh array per batch (``yield np.stack(samples)``)
needs no protecting copy: the prefetcher hands such a batch over as is. A
loader that refills one buffer (``np.stack(samples, out=buf); yield buf``)
must still be copied. Rows, in µs per batch, interleaved (each repetition
starts the row list at a different place), for 1 MiB and 19 MB batches, with a
consumer that only waits and one that works (``np.multiply(b, 1.0001,
out=np.empty_like(b))``, which releases the GIL):

  plain loop                         no prefetcher
  thread + queue.Queue, no copy      the unsafe textbook prefetcher (safe here only
                                     for the fresh source)
  ours (default)                     Prefetcher(src, depth=4): hands over fresh arrays
  ours, copy="always"                copies every leaf into pooled memory
  ours, workers=2                    default, two copy threads

Ratios are taken within each repetition, then the median and the min..max over
repetitions are reported. Targets: on the fresh source ours is within 1.10 x
the no-copy thread prefetcher and never slower than the plain loop when the
consumer works; on the refilled source nothing changes (ours = copy="always").

A second table breaks down the overlap loss (issue 13 item 4, SPEC §7): a
producer and a consumer that each sleep P = C = 2 ms per batch (releasing the
GIL), N batches, for queue.Queue (+ np.copy) and ours. The total is split into
N * max(P, C) with P and C as timed inside the run, the first batch (it
cannot overlap with anything: the pipeline's fill, 1/(N+1) of the ideal), the
consumer's wake-ups (from the moment a batch was both produced and wanted to
the moment next() returned it), and the rest (the consumer's own per-batch
cost and the last batch). The efficiency against P and C timed alone also
shows how much time.sleep overshoots when two threads sleep at once.

Run alone: python bench/bench_handover.py [--quick] [--reps 5]
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U

PLAIN = "plain loop"
QUEUE = "thread + queue.Queue(4), no copy"
OURS = "ours (default)"
ALWAYS = 'ours, copy="always"'
W2 = "ours, workers=2"
ROWS = [PLAIN, QUEUE, OURS, ALWAYS, W2]
MB = 10**6
MiB = 2**20
DEPTH = 4
SAMPLES = 16          # samples collated per batch


def default_cfg(quick=False):
    return {"sizes": [1 * MiB, 19 * MB], "reps": 3 if quick else 5,
            "target_s": 0.08 if quick else 0.2, "n_min": 8, "n_max": 2000,
            "overlap_n": [60] if quick else [60, 150]}


def _samples(nbytes):
    rng = np.random.default_rng(0)
    return [rng.random(nbytes // 8 // SAMPLES) for _ in range(SAMPLES)]


def fresh_source(samples, n):
    """A new array per batch; nothing else references it (handed over)."""
    for _ in range(n):
        yield np.stack(samples)


def refilled_source(samples, n):
    """One buffer, refilled in place per batch (must be copied)."""
    buf = np.empty((len(samples), samples[0].size))
    for _ in range(n):
        np.stack(samples, out=buf)
        yield buf


def _consumer(kind):
    if kind == "waits":
        return None

    def work(b):
        np.multiply(b, 1.0001, out=np.empty_like(b))
    return work


def _make(row, src, prefetch):
    if row == PLAIN:
        return src
    if row == QUEUE:
        return U.QueuePrefetcher(src, DEPTH, copy=False)
    if row == OURS:
        return prefetch.Prefetcher(src, depth=DEPTH)
    if row == ALWAYS:
        return prefetch.Prefetcher(src, depth=DEPTH, copy="always")
    return prefetch.Prefetcher(src, depth=DEPTH, workers=2)


def time_row(row, source, samples, n, work, prefetch):
    """ns per batch over n batches, construction and teardown included (as a user
    would see them in one epoch), and the prefetcher's stats (or None)."""
    with U.no_gc():
        t0 = U.ns()
        it = _make(row, source(samples, n), prefetch)
        cnt = 0
        if work is None:
            for _b in it:
                cnt += 1
        else:
            for b in it:
                work(b)
                cnt += 1
            del b
        t = U.ns() - t0
    stats = it.stats() if hasattr(it, "stats") else None
    U.close_quietly(it)
    if cnt != n:
        raise RuntimeError(f"{row}: expected {n} batches, got {cnt}")
    return t / n, stats


def _cases(cfg):
    return [(size, src, cons) for size in cfg["sizes"] for src in ("fresh", "refilled")
            for cons in ("waits", "works")]


def steps(cfg):
    return len(_cases(cfg)) * cfg["reps"] * len(ROWS) + 1


def _ratio_summary(num, den):
    xs = [a / b for a, b in zip(num, den)]
    s = U.summary(xs)
    return {"median": s["median"], "min": s["min"], "max": s["max"], "samples": xs}


def run(cfg, prog=None):
    prog = prog or U.NullProgress()
    prefetch, why = U.load_prefetch()
    if prefetch is None:
        return {"params": dict(cfg), "skipped": why, "cases": {}}
    res = {"params": dict(cfg), "cases": {}, "load": os.getloadavg()}
    for size, srcname, cons in _cases(cfg):
        samples = _samples(size)
        source = fresh_source if srcname == "fresh" else refilled_source
        work = _consumer(cons)
        # Batches per run: about target_s of plain-loop time.
        time_row(PLAIN, source, samples, 3, work, prefetch)   # warm-up: page in, caches
        per, _ = time_row(PLAIN, source, samples, 10, work, prefetch)
        n = int(min(cfg["n_max"], max(cfg["n_min"], cfg["target_s"] * 1e9 / per)))
        us = {r: [] for r in ROWS}
        handed = {}
        for rep in range(cfg["reps"]):
            for row in U.rotate(ROWS, rep):
                prog.set(f"handover {size // 1000} kB {srcname} {cons}: {row}")
                t, st = time_row(row, source, samples, n, work, prefetch)
                us[row].append(t / 1e3)
                if st is not None:
                    handed[row] = (st.leaves_handed_over, st.leaves_copied)
                prog.tick()
        name = f"{size / MiB:.0f} MiB" if size == MiB else f"{size / MB:.0f} MB"
        res["cases"][f"{name}, {srcname}, consumer {cons}"] = {
            "size": size, "source": srcname, "consumer": cons, "n": n,
            "us_per_batch": {r: U.summary(v) for r, v in us.items()},
            "samples_us": us,
            "leaves_handed_over_copied": handed,
            "ours/queue": _ratio_summary(us[OURS], us[QUEUE]),
            "ours/plain": _ratio_summary(us[OURS], us[PLAIN]),
            "ours/always": _ratio_summary(us[OURS], us[ALWAYS]),
            "workers2/plain": _ratio_summary(us[W2], us[PLAIN]),
        }
    prog.set("handover: overlap breakdown")
    res["overlap"] = {str(n): {row: [overlap_breakdown(row, n, prefetch) for _ in range(cfg["reps"])]
                               for row in ("queue.Queue + np.copy", OURS)}
                      for n in cfg["overlap_n"]}
    prog.tick()
    res["targets"] = _targets(res)
    return res


def overlap_breakdown(row, n, prefetch, p_s=2e-3, c_s=2e-3):
    """Where the time of n overlapped batches goes (ms), for one row."""
    ready, got, done = [], [], []
    batch = (np.zeros((4, 8), np.float32), np.zeros(4, np.int64))
    alone = U.ns()
    for _ in range(10):
        time.sleep(p_s)
    alone = (U.ns() - alone) / 10

    def src():
        for _ in range(n):
            time.sleep(p_s)
            ready.append(U.ns())
            yield batch

    with U.no_gc():
        t0 = U.ns()
        it = (U.QueuePrefetcher(src(), DEPTH, copy=True) if row != OURS
              else prefetch.Prefetcher(src(), depth=DEPTH))
        for _b in it:
            got.append(U.ns())
            time.sleep(c_s)
            done.append(U.ns())
        total = U.ns() - t0
    U.close_quietly(it)
    p_in = (ready[-1] - ready[0]) / (n - 1)
    c_in = sum(d - g for d, g in zip(done, got)) / n
    ideal = n * max(p_in, c_in)
    first = got[0] - t0
    wakes = sorted(got[i] - max(ready[i], done[i - 1]) for i in range(1, n))
    ms = 1e-6
    return {"total_ms": total * ms, "ideal_inrun_ms": ideal * ms, "eff_inrun": ideal / total,
            "eff_alone": n * alone / total, "perfect_pipeline": n / (n + 1),
            "first_batch_ms": first * ms, "wakeups_ms": sum(wakes) * ms,
            "wakeup_median_us": wakes[len(wakes) // 2] / 1e3,
            "rest_ms": (total - ideal - first - sum(wakes) + max(p_in, c_in)) * ms,
            "sleep_overshoot_pct": 100 * (p_in / alone - 1)}


def _targets(res):
    fresh = {k: v for k, v in res["cases"].items() if v["source"] == "fresh"}
    refilled = {k: v for k, v in res["cases"].items() if v["source"] == "refilled"}
    within = {k: v["ours/queue"]["median"] for k, v in fresh.items()}
    never = {k: v["ours/plain"]["median"] for k, v in fresh.items() if v["consumer"] == "works"}
    same = {k: v["ours/always"]["median"] for k, v in refilled.items()}
    return {
        "fresh_within_1.10x_queue": {"by_case": within, "met": all(x <= 1.10 for x in within.values())},
        "fresh_not_slower_than_plain_when_working": {"by_case": never,
                                                     "met": all(x <= 1.0 for x in never.values())},
        "refilled_unchanged_vs_always_copy": {"by_case": same},
    }


def report(res):
    if not res["cases"]:
        return [f"[handover] skipped: {res.get('skipped')}"]
    p = res["params"]
    out = [(f"[handover] µs per batch, median ±half-IQR over {p['reps']} interleaved repetitions "
            f"(depth={DEPTH}; load average at the end {res['load'][0]:.1f}: shared machine, noisy).")]
    cases = list(res["cases"])
    for size in p["sizes"]:
        cs = [c for c in cases if res["cases"][c]["size"] == size]
        header = ["row"] + [c.split(", ", 1)[1] for c in cs]
        rows = [[r] + [U.fmt(res["cases"][c]["us_per_batch"][r], 0) for c in cs] for r in ROWS]
        out.append(f"  {cs[0].split(',')[0]} batches (n per run: "
                   + ", ".join(str(res['cases'][c]['n']) for c in cs) + ")")
        out += ["  " + x for x in U.table_lines(header, rows)]
        rrows = []
        for key in ("ours/queue", "ours/plain", "ours/always", "workers2/plain"):
            rrows.append([key] + [f"{res['cases'][c][key]['median']:.2f} "
                                  f"[{res['cases'][c][key]['min']:.2f}..{res['cases'][c][key]['max']:.2f}]"
                                  for c in cs])
        out += ["  " + x for x in U.table_lines(["ratio, median [min..max]"] + header[1:], rrows)]
        hand = [["leaves handed over / copied (ours)"]
                + ["{} / {}".format(*res["cases"][c]["leaves_handed_over_copied"].get(OURS, (0, 0)))
                   for c in cs]]
        out += ["  " + x for x in U.table_lines([""] + header[1:], hand)]
    keys = ["eff_alone", "eff_inrun", "perfect_pipeline", "first_batch_ms", "wakeups_ms",
            "wakeup_median_us", "rest_ms", "sleep_overshoot_pct"]
    for n, rows in res["overlap"].items():
        out.append(f"  overlap breakdown, sleep P = C = 2 ms, N = {n}, depth={DEPTH} (median of "
                   f"{p['reps']}; ms unless marked)")
        table = [[row] + [f"{sorted(r[k] for r in reps)[len(reps) // 2]:.3f}" for k in keys]
                 for row, reps in rows.items()]
        out += ["  " + x for x in U.table_lines(["row"] + keys, table)]
    t = res["targets"]
    out.append("  targets: fresh within 1.10x queue: " + str(t["fresh_within_1.10x_queue"]["met"])
               + "; fresh never slower than plain (consumer works): "
               + str(t["fresh_not_slower_than_plain_when_working"]["met"]))
    return out


def main(argv=None):
    return U.section_main(__doc__, default_cfg, run, report, steps, argv=argv,
                          options=[("reps", int)])


if __name__ == "__main__":
    main()
