"""MXNet at engine speed: cost per batch of feeding from an mx.io.NDArrayIter.

Rows, interleaved in every repetition: the plain DataIter loop; the plain loop
plus one engine copyto() of the data into a reused NDArray (what one copy of
the batch costs); mx.io.PrefetchingIter (no copy: it hands out the source's
arrays); prefetch.mx.PrefetchingIter at depth 1 and 4 (a fresh copy of every
batch). Three batch shapes, and two consumers: one that only waits for
batch.data[0] (so the rows measure what feeding costs) and one that computes
one MXNet operator on it. "Extra" is a row's time per batch minus the plain
loop's in the same repetition. Page faults per batch show whether steady
state allocates. Runs only when MXNet imports.

A second table feeds a Gluon DataLoader (batch 64 x 3x112x112): directly,
directly plus one engine copy, through prefetch.Prefetcher(loader), and with
device=mx.cpu_pinned(0).

--quick measures the (64, 10) target alone: 400 batches per pass, the
consumer waits, no Gluon table. Where MXNet does not import (the torch
bench environment: MXNet 1.9.1 needs numpy < 1.24), run.py runs the section
in the MXNet environment (MX_ROWS; bench/main.sh passes --mx-python).

Run alone: python bench/bench_mx_engine.py [--quick] [--reps N]
"""
from __future__ import annotations

import math
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")  # as bench/run.py: 2 cores, no OpenMP team

import _baselines as B  # noqa: E402
import _stats as S  # noqa: E402
import _util as U  # noqa: E402
import numpy as np  # noqa: E402

TITLE = "MXNet feeding cost per batch (NDArrayIter)"
MX_ROWS = True
SHAPES = [(64, 10), (64, 3, 64, 64), (32, 3, 224, 224)]
PLAIN, COPY, MXPF, OURS1, OURS4 = ("plain DataIter loop", "plain loop + one engine copyto()",
                                   "mx.io.PrefetchingIter (no copy)",
                                   "prefetch.mx.PrefetchingIter depth 1",
                                   "prefetch.mx.PrefetchingIter depth 4")
ROWS = [PLAIN, COPY, MXPF, OURS1, OURS4]
CONSUMERS = ("waits", "computes")
DL_DIRECT, DL_COPY, DL_OURS, DL_PINNED = ("DataLoader, direct", "DataLoader + one engine copyto()",
                                          "prefetch.Prefetcher(loader)",
                                          "prefetch.Prefetcher(loader, device=mx.cpu_pinned(0))")
DL_ROWS = [DL_DIRECT, DL_COPY, DL_OURS, DL_PINNED]
DL_SHAPE = (64, 3, 112, 112)
SOURCE_BYTES = 256 << 20  # cap on each shape's source data (sets batches per pass)
QUICK_BATCHES = 400       # per pass in --quick: the (64, 10) target's protocol


def add_arguments(g):
    g.add_argument("--engine-shapes", help="batch shapes, e.g. 64x10,32x3x224x224")


def config(a):
    shapes = SHAPES if not getattr(a, "engine_shapes", None) else [
        tuple(int(d) for d in s.split("x")) for s in a.engine_shapes.split(",")]
    if a.quick and not getattr(a, "engine_shapes", None):
        shapes = SHAPES[:1]
    return {"shapes": shapes, "reps": a.reps or (9 if a.quick else 15),
            "target_s": 0.04 if a.quick else 0.15, "skip": a.no_mx,
            "consumers": ["waits"] if a.quick else list(CONSUMERS),
            "batches": QUICK_BATCHES if a.quick else None, "gluon": not a.quick, "quick": a.quick}


def _pass(mx, pmx, row, data, batch, nbatches, consumer):
    """(seconds per batch, page faults per batch) of one pass over the source."""
    it = mx.io.NDArrayIter(data, batch_size=batch)
    dst = mx.nd.empty((batch,) + data.shape[1:]) if row == COPY else None
    if row == MXPF:
        it = mx.io.PrefetchingIter(it)
    elif row in (OURS1, OURS4):
        it = pmx.PrefetchingIter(it, depth=1 if row == OURS1 else 4)
    mx.nd.waitall()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    n = 0
    for b in it:
        x = b.data[0]
        if dst is not None:
            x.copyto(dst)
            x = dst
        if consumer == "computes":
            x = x * 2
        x.wait_to_read()
        n += 1
    t = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    if row == MXPF:
        it.__del__()  # mx's class keeps its thread (and the batch) otherwise
    elif row in (OURS1, OURS4):
        it.close()
    if n != nbatches:
        raise RuntimeError(f"{row}: {n} batches, expected {nbatches}")
    return t / n, faults / n


def _loader_pass(mx, row, loader):
    """Seconds per batch of one epoch of a Gluon DataLoader."""
    import prefetch
    dst = mx.nd.empty(DL_SHAPE) if row == DL_COPY else None
    it = loader
    if row == DL_OURS:
        it = prefetch.Prefetcher(loader, depth=4)
    elif row == DL_PINNED:
        it = prefetch.Prefetcher(loader, depth=4, device=mx.cpu_pinned(0))
    mx.nd.waitall()
    t0 = time.perf_counter()
    n = 0
    for x in it:
        if dst is not None:
            x.copyto(dst)
            x = dst
        x.wait_to_read()
        n += 1
    t = time.perf_counter() - t0
    if it is not loader:
        it.close()
    return t / n


def _loader_table(mx, cfg, say):
    gluon = mx.gluon.data
    nb = 6 if cfg["target_s"] < 0.1 else 12
    data = mx.nd.random.uniform(shape=(DL_SHAPE[0] * nb,) + DL_SHAPE[1:])
    loader = gluon.DataLoader(gluon.ArrayDataset(data), batch_size=DL_SHAPE[0])
    t = {r: [] for r in DL_ROWS}
    with U.no_gc():
        def unresolved():
            return S.open_verdicts(_verdicts(cfg, {"gluon": t}))

        for rep in S.repetitions(cfg, unresolved, say, "Gluon DataLoader: repetition"):
            for r in U.rotate(DL_ROWS, rep):
                t[r].append(_loader_pass(mx, r, loader) * 1e6)
    return t


def _loader_lines(t, cfg):
    nb = 6 if cfg["target_s"] < 0.1 else 12
    tab = [[r, S.interval(t[r]).text(0), S.interval(S.ratios(t[r], t[DL_COPY])).text(3)] for r in DL_ROWS]
    lines = [f"  Gluon DataLoader, batch {'x'.join(map(str, DL_SHAPE))}, {nb} batches/epoch, consumer waits"]
    return lines + U.table_lines(["row", "µs per batch", "vs direct + copy"], tab)


def run(cfg, say):
    mx, why = B.load_mx() if not cfg["skip"] else (None, "left out (--no-mx)")
    if mx is None:
        return {"tables": [f"  (not measured: {why})"], "verdicts": [], "data": {}, "skipped": why}
    return _result(cfg, _measure(mx, cfg, say))


def _measure(mx, cfg, say):
    import prefetch.mx as pmx

    data_out = {}
    for consumer in cfg["consumers"]:
        for shape in cfg["shapes"]:
            batch, item_bytes = shape[0], 4 * math.prod(shape[1:])
            cap = max(8, SOURCE_BYTES // (item_bytes * batch))
            probe = mx.nd.random.uniform(shape=(batch * 8,) + tuple(shape[1:]))
            per = _pass(mx, pmx, PLAIN, probe, batch, 8, consumer)[0]
            nb = cfg.get("batches") or int(max(8, min(cap, 3000, cfg["target_s"] / per)))
            data = mx.nd.random.uniform(shape=(batch * nb,) + tuple(shape[1:]))
            del probe
            t = {r: [] for r in ROWS}
            f = {r: [] for r in ROWS}
            key = f"{consumer} {shape}"
            data_out[key] = {"batches": nb, "us": t, "faults": f}   # filled in place below

            def unresolved(key=key):   # a target of this batch shape still straddled by its interval
                return S.open_verdicts(_verdicts(cfg, {key: data_out[key]}))

            with U.no_gc():
                for rep in S.repetitions(cfg, unresolved, say, f"{consumer}, batch {shape}: repetition"):
                    for r in U.rotate(ROWS, rep):
                        s, flt = _pass(mx, pmx, r, data, batch, nb, consumer)
                        t[r].append(s * 1e6)
                        f[r].append(flt)
            del data
            mx.nd.waitall()
    if cfg.get("gluon", True):
        data_out["gluon"] = _loader_table(mx, cfg, say)
    return data_out


def _result(cfg, data_out):
    """Tables and verdicts from the figures (measured here or in another environment)."""
    lines = []
    for consumer in cfg["consumers"]:
        lines.append(f"  consumer {consumer}: µs per batch, median [95% interval]; extra over the plain loop")
        tab = []
        for shape in cfg["shapes"]:
            d = data_out[f"{consumer} {shape}"]
            t = d["us"]
            for r in ROWS:
                extra = [a - b for a, b in zip(t[r], t[PLAIN])]
                tab.append([f"{'x'.join(map(str, shape))} ({d['batches']}/pass) {r}",
                            S.interval(t[r]).text(1), "" if r == PLAIN else S.interval(extra).text(1),
                            "" if r == PLAIN else S.interval(S.ratios(t[r], t[COPY])).text(3),
                            f"{S.interval(d['faults'][r]).median:.1f}"])
        lines += U.table_lines(["batch, row", "µs per batch", "extra µs", "vs plain + copy", "faults/batch"],
                               tab)
    if "gluon" in data_out:
        lines += _loader_lines(data_out["gluon"], cfg)
    small = data_out.get(f"waits {SHAPES[0]}")
    claims = [] if small is None else [f"prefetch.mx.PrefetchingIter's extra cost per (64, 10) batch "
                                       f"{extra_ratio(small['us']).text(2)} x mx.io.PrefetchingIter's (lower is cheaper)"]
    return {"tables": lines, "verdicts": _verdicts(cfg, data_out), "data": data_out, "claims": claims}


def extra_ratio(t):
    """Per repetition: prefetch.mx.PrefetchingIter's extra µs per batch over the plain loop,
    over mx.io.PrefetchingIter's (below 1: ours costs less)."""
    return S.interval(S.ratios([o - p for o, p in zip(t[OURS4], t[PLAIN])], [m - p for m, p in zip(t[MXPF], t[PLAIN])]))


def _verdicts(cfg, data_out):
    out = []
    small = data_out.get(f"waits {SHAPES[0]}")
    if small is not None:
        iv = extra_ratio(small["us"])
        out.append(S.Verdict("(64,10) batches: extra cost over the plain loop <= 1.00 x mx.io.PrefetchingIter's",
                             f"ratio {iv.text(2)} at depth 4", S.judge(iv, 1.0, higher_is_better=False)))
    if small is not None and not cfg.get("quick"):   # an aim, not what a quick run is for
        t = small["us"]
        over_copy = [(o - p) - 2 * (c - p) for o, p, c in zip(t[OURS4], t[PLAIN], t[COPY])]
        iv = S.interval(over_copy)
        out.append(S.Verdict("(64,10) batches: extra cost <= 2x one engine copy's (aim)",
                             f"ours' extra - 2x copy's extra {iv.text(1)} µs",
                             S.judge(iv, 0.0, higher_is_better=False)))
    big = data_out.get(f"waits {SHAPES[2]}")
    if big is not None:
        t = big["us"]
        iv = S.interval(S.ratios(t[OURS4], t[COPY]))
        out.append(S.Verdict("19 MB batches: prefetch.mx <= 1.10 x (plain loop + one engine copy)",
                             f"ratio {iv.text(3)} at depth 4", S.judge(iv, 1.10, higher_is_better=False)))
    dl = data_out.get("gluon")
    if dl is not None:
        iv = S.interval(S.ratios(dl[DL_OURS], dl[DL_COPY]))
        out.append(S.Verdict("Gluon DataLoader: Prefetcher(loader) <= 1.10 x (direct + one copy)",
                             f"ratio {iv.text(3)}", S.judge(iv, 1.10, higher_is_better=False)))
        # "No more than one copy more": direct + two copies, 10 % slack as above.
        two = [c + (c - d) for c, d in zip(dl[DL_COPY], dl[DL_DIRECT])]
        iv = S.interval(S.ratios(dl[DL_PINNED], two))
        out.append(S.Verdict("Gluon DataLoader: device=cpu_pinned <= 1.10 x (direct + two copies)",
                             f"ratio {iv.text(3)}", S.judge(iv, 1.10, higher_is_better=False)))
    return out


def plot(ax, data):
    """Each row's time per batch over (plain loop + one engine copy), by batch shape, and the
    Gluon DataLoader rows over (direct + one copy), with their 1.10 target line; a quick run
    (the (64, 10) shape alone) draws the target it judges instead: prefetch.mx's extra cost
    over mx.io.PrefetchingIter's, at most 1.00."""
    groups = [k for k in data if k != "gluon"] + (["gluon"] if "gluon" in data else [])
    if groups == [f"waits {SHAPES[0]}"]:
        _plot_extra_ratio(ax, data[groups[0]]["us"])
        return
    rows = [r for r in ROWS if r not in (PLAIN, COPY)] + [r for r in (DL_OURS, DL_PINNED)]
    width = 0.8 / len(rows)
    for j, r in enumerate(rows):
        xs, ys, errs = [], [], []
        for i, g in enumerate(groups):
            t, base = (data[g], DL_COPY) if g == "gluon" else (data[g]["us"], COPY)
            if r not in t:
                continue
            iv = S.interval(S.ratios(t[r], t[base]))
            xs.append(i + (j - (len(rows) - 1) / 2) * width)
            ys.append(iv.median)
            errs.append(iv.errbar())
        if xs:
            ax.bar(xs, ys, width, yerr=np.array(errs).T, capsize=2, label=r)
    ax.axhline(1.10, color="k", ls="--", lw=0.8, label="target (19 MB batches, Gluon DataLoader): "
               "1.10 x (plain loop or loader + one engine copy)")
    ax.set_xticks(range(len(groups)), [("Gluon DataLoader" if g == "gluon" else f"consumer {g}")
                                       for g in groups], fontsize=7)
    ax.set_ylabel("time per batch / (plain + one copy)")
    ax.set_title("MXNet feeding cost per batch, lower is better (median, bars: 95% interval)")


def _plot_extra_ratio(ax, t):
    """(64, 10) batches: each prefetch.mx row's extra µs per batch over the plain loop, over
    mx.io.PrefetchingIter's, and the target line at 1.00."""
    base = [m - p for m, p in zip(t[MXPF], t[PLAIN])]
    for i, r in enumerate((OURS1, OURS4)):
        iv = S.interval(S.ratios([o - p for o, p in zip(t[r], t[PLAIN])], base))
        ax.bar([i], [iv.median], 0.6, yerr=np.array([iv.errbar()]).T, capsize=3, label=r)
    ax.axhline(1.0, color="k", ls=":", lw=1.2, label="target: 1.00 x mx.io.PrefetchingIter's extra cost")
    ax.set_xticks([0, 1], ["depth 1", "depth 4"], fontsize=8)
    ax.set_ylabel("extra µs per batch / mx.io.PrefetchingIter's")
    ax.set_title("MXNet (64, 10) batches: extra cost per batch over a plain loop, lower is better "
                 "(median, bars: 95% interval)", fontsize=10)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--no-mx", action="store_true")
    add_arguments(ap)
    r = run(config(ap.parse_args(argv)), lambda text, final=False: print(f"\r{text:80s}", end="",
                                                                          file=sys.stderr, flush=True))
    print(file=sys.stderr)
    print("\n".join(r["tables"]))
    for v in r["verdicts"]:
        print(f"  {v.target}: {v.measured} -> {v.status}")


if __name__ == "__main__":
    main()
