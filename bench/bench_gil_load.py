"""Section: the GILBoundWarning beside busy processes (does it tell the GIL from busy CPUs?).

Fresh loaders, each iterated for a few seconds (--gil-load-s) or until its
prefetch.GILBoundWarning, beside 0, 2 and 4 busy processes (each a Python loop
keeping one CPU busy, started before the loaders and killed after). Datasets, in
this order within each count of busy processes:

    pure Python       the GIL-bound section's dataset (tokenising in Python, holds the
                      GIL throughout); Loader() (workers="auto", the default)
    image pipeline    the image section's dataset (Pillow decode, crop, normalise):
                      its threads run in parallel; Loader(workers=2)
    numpy/BLAS        dataset[i] multiplies 256x256 float64 matrices (BLAS releases
                      the GIL and runs its own threads on every CPU); Loader(workers=2);
                      then a pause while BLAS's threads go idle (BLAS_IDLE_S)

Each cell is the count of loaders that warned out of --gil-load-runs (default 3;
quick 2), and for pure Python the slowest time to the warning. Busy processes
take CPUs from the loader threads: threads waiting for a CPU are not waiting for
the GIL, and processes would not load a GIL-free dataset faster, so the image
pipeline and numpy/BLAS must never warn. Pure-Python threads wait for the GIL whatever the
other processes do (processes would get a share of the CPUs per process, where
GIL-bound threads get one), so it must warn, within 2 s, beside 0 and 2 busy
processes. Beside 4 on 2 CPUs it is reported, not judged.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import numpy as np

import _stats as S
import _util as U

TITLE = "GILBoundWarning beside busy processes: image pipeline, numpy/BLAS, pure Python"
GIL_WARNINGS = True   # its GILBoundWarnings are its subject: not counted by bench/run.py

HOGS = (0, 2, 4)
PURE_HOGS_JUDGED = (0, 2)
WARN_S = 2.0          # the pure-Python warning's target
# BLAS's threads spin for about 0.15 s after the last product: a loader started meanwhile in
# this process sees its other threads keep the CPUs busy, and judges no window (as it should),
# so the next cell waits for them to go idle rather than measure the previous one's tail.
BLAS_IDLE_S = 0.5
BATCH = 32


def add_arguments(g):
    g.add_argument("--gil-load-runs", type=int, default=None, help="loaders per cell (default 3; quick 2)")
    g.add_argument("--gil-load-s", type=float, default=None,
                   help="seconds each loader is iterated when it does not warn (default 3; quick 2)")


def config(a):
    return {"runs": a.gil_load_runs or (2 if a.quick else 3), "seconds": a.gil_load_s or (2.0 if a.quick else 3.0),
            "gil_ms": a.gil_ms}


class Matmul:
    """numpy/BLAS: dataset[i] is three products of 256x256 float64 matrices (BLAS, without the GIL)."""

    def __init__(self, n):
        self.n = n
        self.m = np.random.default_rng(0).random((256, 256))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        a = self.m
        for _ in range(3):
            a = (a @ self.m) * (1.0 / 256)
        return a[:8, :8].astype(np.float32), i % 10


@contextlib.contextmanager
def busy_processes(n):
    """``n`` processes that each keep one CPU busy, for the block's duration."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        time.sleep(0.2 if n else 0)   # started and running before the loader is (not a synchronisation)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def warned_after(ds, workers, seconds):
    """A fresh Loader iterated until its GILBoundWarning or for ``seconds``: the
    seconds since its first iter() when the warning came, or None."""
    import prefetch
    with U.gil_warnings() as notes, prefetch.Loader(ds, batch_size=BATCH, workers=workers) as loader:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds and not notes:
            for _batch in loader:
                if notes:
                    break
        return notes[0][0] - t0 if notes else None


def _datasets(cfg):
    import bench_gil
    import bench_loader
    sets = {}
    # The GIL-bound section's calibration: about --gil-ms per batch on one thread (an epoch
    # shorter than the gauge's 50 ms window would never be judged).
    rounds = max(1, round(cfg["gil_ms"] / 1e3 / bench_gil._serial_batch_s(bench_gil.Texts(BATCH, 1))))
    sets["pure Python"] = (bench_gil.Texts(6 * BATCH, rounds), "auto", True)
    try:
        import PIL  # noqa: F401
        sets["image pipeline"] = (bench_loader.Images(bench_loader.make_jpegs(16), 6 * BATCH), 2, False)
    except ImportError:
        pass
    sets["numpy/BLAS"] = (Matmul(6 * BATCH), 2, False)   # last: see BLAS_IDLE_S
    return sets


def run(cfg, say):
    sets = _datasets(cfg)
    cells = {name: {} for name in sets}   # name -> hogs -> [seconds to the warning, or None]
    for hogs in HOGS:
        with busy_processes(hogs):
            for name, (ds, workers, gil_bound) in sets.items():
                cells[name][hogs] = []
                for k in range(cfg["runs"]):
                    say(f"{name} beside {hogs} busy processes: loader {k + 1} of {cfg['runs']}")
                    cells[name][hogs].append(warned_after(ds, workers, 3 * WARN_S if gil_bound else cfg["seconds"]))
                    if isinstance(ds, Matmul):
                        time.sleep(BLAS_IDLE_S)
    rows, verdicts = [], []
    for name, (_ds, workers, gil_bound) in sets.items():
        row = [f"{name} (workers={workers!r})"]
        for hogs in HOGS:
            got = [s for s in cells[name][hogs] if s is not None]
            text = f"{len(got)} of {len(cells[name][hogs])}"
            if gil_bound and got:
                text += f", within {max(got):.1f} s"
            row.append(text)
        rows.append(row)
        if gil_bound:
            judged = [s for h in PURE_HOGS_JUDGED for s in cells[name][h]]
            ok = all(s is not None and s <= WARN_S for s in judged)
            verdicts.append(S.Verdict(
                f"pure-Python dataset[i]: Loader() warns within {WARN_S:.0f} s beside "
                f"{' and '.join(map(str, PURE_HOGS_JUDGED))} busy processes",
                f"{sum(s is not None and s <= WARN_S for s in judged)} of {len(judged)} loaders",
                S.MET if ok else S.MISSED))
        else:
            n = sum(s is not None for h in HOGS for s in cells[name][h])
            total = sum(len(cells[name][h]) for h in HOGS)
            verdicts.append(S.Verdict(
                f"{name}: no GILBoundWarning beside {', '.join(map(str, HOGS))} busy processes",
                f"{n} warning(s) in {total} loaders", S.MISSED if n else S.MET))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"  {cpus} CPUs; each loader iterated for {cfg['seconds']:.0f} s or until it warned (pure Python: "
             f"at most {3 * WARN_S:.0f} s); loaders that warned, of {cfg['runs']} per cell", ""]
    lines += U.table_lines(["GILBoundWarning given"] + [f"beside {h} busy" for h in HOGS], rows)
    data = {"cells": {name: {str(h): v for h, v in by.items()} for name, by in cells.items()}, "cpus": cpus}
    return {"tables": lines, "verdicts": verdicts, "data": data}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run as harness
    sys.exit(harness.main(["--sections", "gil_load", "--no-plot", *sys.argv[1:]]))
