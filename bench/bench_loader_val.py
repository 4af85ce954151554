"""Section: training epochs with a validation pass between them (a second Loader).

The image section's dataset (Pillow decode, crop, normalise; batches of 32) and
a GIL-free training step as long as one batch takes to load on one thread
("step = load": two threads keep up, so 1/step is the ideal). Between two
training epochs a validation pass runs a second prefetch.Loader(workers=2) over
a small eval dataset (--val-batches batches of the same images), with a step of
half the training one (a forward pass only). Rows, interleaved within each
repetition, each the training epoch timed right after what precedes it:

    after an epoch              the training epoch right after another one (no validation)
    after a validation pass     the training epoch right after a validation pass

Each figure is the training epoch's batches/s over 1/step (1.0: the step alone
sets the pace). The target: >= 0.95 after a validation pass, where the training
loader's threads and the eval loader's share the CPUs, and the training epoch's
first batches must be ready when it starts.
"""
from __future__ import annotations

import os
import sys
import time

import _stats as S
import _util as U
import bench_loader as L

TITLE = "Epochs with a validation pass between them (a second Loader)"
GOAL = 0.95
AFTER_EPOCH = "after an epoch"
AFTER_VAL = "after a validation pass"


def add_arguments(g):
    g.add_argument("--val-batches", type=int, default=2, help="batches in the validation pass")


def config(a):
    return {"reps": a.reps or (6 if a.quick else 10), "batches": a.loader_batches or (6 if a.quick else 12),
            "val_batches": a.val_batches}


def _epoch(loader, step_s):
    """Batches/s of one epoch consumed at ``step_s`` a batch (a GIL-free wait, as a GPU step)."""
    t0 = time.perf_counter()
    k = 0
    for _batch in loader:
        time.sleep(step_s)
        k += 1
    return k / (time.perf_counter() - t0)


def run(cfg, say):
    try:
        import PIL  # noqa: F401
    except ImportError:
        return {"tables": [], "verdicts": [], "data": {},
                "skipped": "Pillow is not installed (pip install Pillow)"}
    import prefetch
    jpegs = L.make_jpegs(64)
    train = L.Images(jpegs, cfg["batches"] * L.BATCH)
    evals = L.Images(jpegs[::-1], cfg["val_batches"] * L.BATCH)
    step = L.load_time_s(train)
    frac = {AFTER_EPOCH: [], AFTER_VAL: []}
    with prefetch.Loader(train, batch_size=L.BATCH, workers=2) as tl, \
            prefetch.Loader(evals, batch_size=L.BATCH, workers=2) as vl:
        _epoch(tl, step)   # warm: threads started, pools filled
        _epoch(vl, step / 2)
        for rep in S.repetitions(cfg, lambda: False, say, "validation epochs"):
            for row in U.rotate(list(frac), rep):
                _epoch(tl, step)   # the epoch before
                if row == AFTER_VAL:
                    _epoch(vl, step / 2)
                frac[row].append(_epoch(tl, step) * step)
    iv = S.interval(frac[AFTER_VAL])
    verdicts = [S.Verdict(f"training epochs after a validation pass (a second Loader) >= {GOAL:.2f} x 1/step",
                          f"{iv.text(2)} x 1/step", S.judge(iv, GOAL, True))]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"  step = one batch's load time on one thread, {step * 1e3:.0f} ms; {cpus} CPUs; training epochs of "
             f"{cfg['batches']} batches, validation passes of {cfg['val_batches']} (step/2), both Loader(workers=2)",
             ""] + U.table_lines(["training epoch, batches/s x step (1.0 = 1/step)", "median [95% interval]"],
                                 [[row, S.interval(v).text(2)] for row, v in frac.items()])
    return {"tables": lines, "verdicts": verdicts, "data": {"fraction_of_1_over_step": frac, "step_s": step}}


def plot(ax, data):
    """Training epochs' batches/s x step after an epoch and after a validation pass (median,
    bar: 95% interval), and the target line GOAL x 1/step."""
    S.row_bars(ax, data["fraction_of_1_over_step"])
    ax.axvline(GOAL, linestyle=":", color="k", linewidth=1.2, label=f"target: {GOAL:.2f} x 1/step")
    ax.set_xlabel(f"training epoch's batches/s x step ({data['step_s'] * 1e3:.0f} ms; 1.0 = 1/step), higher is better")
    ax.set_title("Epochs after a validation pass (a second Loader): median; bars: 95% interval", fontsize=10)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run as harness
    sys.exit(harness.main(["--sections", "loader_val", "--no-plot", *sys.argv[1:]]))
