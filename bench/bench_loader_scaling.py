"""Section: the Loader's own costs and how it scales.

- Per-sample overhead: tiny samples (a 4-float array and an int), batches of
  32; the extra time per sample over calling dataset[i] in a plain loop, for
  prefetch.Loader(workers=1) and for a ThreadPoolExecutor(1).map + np.stack.
- Scaling: a GIL-free dataset[i] (a large ufunc) with 1 and 2 threads; an
  I/O-like one (time.sleep(2 ms)) with 1 and 16 threads.
- workers="auto" beside the best fixed count on a GIL-bound, a GIL-free and an
  I/O-like dataset (after one epoch to settle, as a training run would).
- Memory: page faults per batch in steady state and RSS over 50 epochs of
  19 MB batches.
Rows are interleaved within each repetition; ratios are per repetition.
"""
from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import _stats as S
import _util as U

TITLE = "Loader: per-sample cost, scaling with threads, workers=\"auto\", memory"
BATCH = 32


def config(a):
    return {"reps": a.reps or (6 if a.quick else 10), "quick": a.quick}


class Tiny:
    def __init__(self, n):
        self.n = n
        self.x = np.arange(4, dtype=np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.x + i, i


class GilFree:
    """A ufunc over 1 MB per sample: numpy releases the GIL inside it."""

    def __init__(self, n):
        self.n = n
        self.a = np.linspace(0, 1, 1 << 17)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.exp(np.sin(self.a)).astype(np.float32)[:1024] + i


class GilBound:
    """Pure Python per sample: one thread at a time, whatever the count."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = 0
        for k in range(2000):
            s += k ^ i
        return np.full(4, s, np.float32)


class IoLike:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.002)
        return np.full(4, i, np.float32)


def _epoch_s(make_iter):
    t0 = time.perf_counter()
    for _ in make_iter():
        pass
    return time.perf_counter() - t0


def _plain(ds):
    def run():
        for s in range(0, len(ds), BATCH):
            samples = [ds[i] for i in range(s, min(s + BATCH, len(ds)))]
            yield np.stack([x for x, _ in samples]), np.array([y for _, y in samples])
    return run


def _thread_map(ds, pool):
    def run():
        for s in range(0, len(ds), BATCH):
            samples = list(pool.map(ds.__getitem__, range(s, min(s + BATCH, len(ds)))))
            yield np.stack([x for x, _ in samples]), np.array([y for _, y in samples])
    return run


def _bare(ds):
    """dataset[i] alone, the floor both rows are measured above."""
    def run():
        for i in range(len(ds)):
            ds[i]
        return ()
    return run


def _per_sample(cfg, say):
    import prefetch
    ds = Tiny(2048 if cfg["quick"] else 8192)
    pool = ThreadPoolExecutor(1)
    loader = prefetch.Loader(ds, batch_size=BATCH, workers=1)
    rows = {"dataset[i] alone": _bare(ds), "ThreadPoolExecutor(1).map + np.stack": _thread_map(ds, pool),
            "prefetch.Loader(workers=1)": lambda: loader}
    us = {k: [] for k in rows}
    try:
        for name in rows:
            _epoch_s(rows[name])   # warm
        for rep in range(cfg["reps"]):
            say(f"per-sample cost {rep + 1}/{cfg['reps']}")
            for name in U.rotate(list(rows), rep):
                with U.no_gc():
                    us[name].append(_epoch_s(rows[name]) / len(ds) * 1e6)
    finally:
        loader.close()
        pool.shutdown()
    extra_ours = [a - b for a, b in zip(us["prefetch.Loader(workers=1)"], us["dataset[i] alone"])]
    extra_tpe = [a - b for a, b in zip(us["ThreadPoolExecutor(1).map + np.stack"], us["dataset[i] alone"])]
    return us, S.interval(S.ratios(extra_ours, extra_tpe))


def _loader_epoch(ds, workers):
    import prefetch
    loader = prefetch.Loader(ds, batch_size=BATCH, workers=workers)
    _epoch_s(lambda: loader)   # settle (auto grows here), threads started
    return loader


def _scaling(cfg, say):
    n = 256 if cfg["quick"] else 512
    cases = {"GIL-free": (GilFree(n), (1, 2)), "I/O-like": (IoLike(n), (1, 16)),
             "GIL-bound": (GilBound(n), (1, 2))}
    out = {}
    for case, (ds, counts) in cases.items():
        # The GIL-bound case's warning is its subject: kept out of bench/run.py's count of
        # GILBoundWarnings where the threads run in parallel (the other cases').
        with U.gil_warnings() if case == "GIL-bound" else contextlib.nullcontext():
            out[case] = _case(ds, counts, cfg, say, case)
    return out


def _case(ds, counts, cfg, say, case):
    """One case's epochs/s per thread count, and the count workers="auto" kept."""
    n = len(ds)
    counts = sorted(set(counts) | {1, 2, 4})
    loaders = {w: _loader_epoch(ds, w) for w in counts}
    loaders["auto"] = _loader_epoch(ds, "auto")
    auto = loaders["auto"]
    _epoch_s(lambda ld=auto: ld)   # a second epoch to settle
    rate = {w: [] for w in loaders}
    try:
        for rep in range(cfg["reps"]):
            say(f"scaling {case} {rep + 1}/{cfg['reps']}")
            for w in U.rotate(list(loaders), rep):
                rate[w].append(n / _epoch_s(lambda ld=loaders[w]: ld))
        threads = loaders["auto"].stats().workers
    finally:
        for ld in loaders.values():
            ld.close()
    return rate, threads


def _memory(cfg, say):
    import prefetch

    class Big:
        def __len__(self):
            return 8 * BATCH

        def __getitem__(self, i):
            return np.full((3, 224, 224), i % 7, np.float32)

    epochs = 15 if cfg["quick"] else 50
    rss, faults = [], []
    with prefetch.Loader(Big(), batch_size=BATCH, workers=2) as loader:
        for _ in range(2):
            for _b in loader:
                pass
        del _b
        for e in range(epochs):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            k = 0
            for _b in loader:
                k += 1
            del _b
            faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / k)
            rss.append(_rss_mb())
            if e % 10 == 0:
                say(f"memory epoch {e + 1}/{epochs}")
    return faults, rss


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def run(cfg, say):
    us, overhead = _per_sample(cfg, say)
    scaling = _scaling(cfg, say)
    faults, rss = _memory(cfg, say)
    verdicts = [S.Verdict("tiny samples: extra cost per sample <= 1/5 of ThreadPoolExecutor.map + np.stack's",
                          f"ratio {overhead.text(3)}", S.judge(overhead, 0.2, higher_is_better=False))]
    lines = U.table_lines(["tiny samples, µs per sample", "median [95% interval]"],
                          [[k, S.interval(v).text(2)] for k, v in us.items()]
                          + [["Loader extra / thread map extra", overhead.text(3)]])
    for case, (rate, threads) in scaling.items():
        best = max((w for w in rate if w != "auto"), key=lambda w: S.interval(rate[w]).median)
        auto_vs_best = S.interval(S.ratios(rate["auto"], rate[best]))
        lines += [""] + U.table_lines([f"{case} dataset[i], samples/s", "median [95% interval]"],
                                      [[f"workers={w}", S.interval(v).text(0)] for w, v in rate.items()]
                                      + [[f"auto (settled at {threads} threads) / workers={best}", auto_vs_best.text(2)]])
        verdicts.append(S.Verdict(f"{case}: workers=\"auto\" within 10% of the best fixed count",
                                  f"{auto_vs_best.text(2)} x workers={best}", S.judge(auto_vs_best, 0.9, True)))
        if case == "GIL-free":
            iv = S.interval(S.ratios(rate[2], rate[1]))
            verdicts.append(S.Verdict("GIL-free dataset[i]: 2 workers >= 1.8 x 1 worker", iv.text(2), S.judge(iv, 1.8, True)))
        if case == "I/O-like":
            iv = S.interval(S.ratios(rate[16], rate[1]))
            verdicts.append(S.Verdict("I/O-like dataset[i]: 16 workers >= 12 x 1 worker", iv.text(2), S.judge(iv, 12, True)))
    f_iv = S.interval(faults)
    verdicts.append(S.Verdict("19 MB batches: <= 1 page fault per batch in steady state", f_iv.text(2),
                              S.judge(f_iv, 1.0, higher_is_better=False)))
    # From a fifth of the run on: the pool may take a block more while the
    # batches in flight settle (bounded, kept for reuse); a leak keeps growing.
    first = len(rss) // 5
    growth = rss[-1] - rss[first]
    lines += ["", f"  memory: {len(rss)} epochs of 8 x 19 MB batches: page faults per batch {f_iv.text(2)}; "
              f"RSS {rss[first]:.0f} MB after epoch {first + 1}, {rss[-1]:.0f} MB after the last "
              f"({growth:+.0f} MB); {rss[0]:.0f} MB after the first"]
    # Flat: no growth with the epochs. One batch's block more, taken once when
    # one more batch happened to be alive at a moment, is bounded and reused
    # (the pool keeps it); a leak grows by blocks every epoch.
    batch_mb = BATCH * 3 * 224 * 224 * 4 / 1e6
    verdicts.append(S.Verdict(f"RSS flat over {len(rss)} epochs (grows by at most one 19 MB batch after the first "
                              f"fifth)", f"{growth:+.1f} MB", S.MET if growth <= batch_mb + 1 else S.MISSED))
    data = {"per_sample_us": us, "scaling": {c: {str(w): v for w, v in r.items()} for c, (r, _t) in scaling.items()},
            "auto_threads": {c: t for c, (_r, t) in scaling.items()}, "faults_per_batch": faults, "rss_mb": rss}
    return {"tables": lines, "verdicts": verdicts, "data": data}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run as harness
    if "loader_scaling" not in harness.SECTIONS:
        harness.SECTIONS.insert(0, "loader_scaling")
    sys.exit(harness.main(["--sections", "loader_scaling", "--no-plot", *sys.argv[1:]]))
