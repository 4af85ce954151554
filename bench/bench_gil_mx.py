"""Section: the GIL-bound dataset of the previous section, loaded with Gluon's loaders.

The same dataset (each sample a text tokenised in pure Python: dataset[i] holds the
GIL, about 26 ms per batch of 32 on one thread), calibrated the same way, at step 0
(the consumer takes batches as fast as they come); every loader built once and each
figure the batches/s of --gil-epochs epochs right after an untimed one; the two
steady Gluon rows take their timed epochs in turn, so that they are measured over
the same seconds. Rows, interleaved within each repetition:

    plain loop                  dataset[i] per sample and np.stack, on the main thread
    Gluon DataLoader(2)         mx.gluon.data.DataLoader(num_workers=2): Gluon's default, processes
    prefetch.mx.DataLoader(2)   the Gluon drop-in (loading="auto"): its threads measure
                                dataset[i] holding the GIL and hand loading to Gluon's own
                                worker processes
    ..., first epoch            a fresh Gluon DataLoader(2) and a fresh drop-in each repetition,
                                their first epoch timed (Gluon's worker processes start in it;
                                the drop-in's threads measure, then hand over)

Batches come out as NDArrays from both Gluon rows (Gluon's default batchify). Targets,
per repetition: the drop-in loads at least 0.95 x the batches/s of Gluon's
DataLoader(num_workers=2), steady and in a first epoch. bench/main.sh runs this
section in its MXNet environment (mxnet 1.9.1, numpy 1.23.5) when the benchmark's
own environment has no mxnet.
"""
from __future__ import annotations

import _baselines as B
import bench_gil as G

TITLE = "GIL-bound dataset on MXNet: Gluon's DataLoader and the Gluon drop-in (where process workers win)"
MX_ROWS = True
GIL_WARNINGS = True   # the drop-in's hand-over is announced by a GILBoundWarning: expected here, not counted

GLUON = "Gluon DataLoader(num_workers=2) (processes)"
GLUON_FIRST = "Gluon DataLoader(num_workers=2), first epoch"
DROPIN = "prefetch.mx.DataLoader(num_workers=2)"
DROPIN_FIRST = "prefetch.mx.DataLoader(num_workers=2), first epoch"
# The drop-in against Gluon's loader, steady and in a fresh loader's first epoch (as the torch
# section judges its drop-in), and the steady pair's timed epochs taken in turn.
PAIRS = [(DROPIN, GLUON), (DROPIN_FIRST, GLUON_FIRST)]
PAIRED = (GLUON, DROPIN)


def config(a):
    # The dataset, its calibration and the repetitions are the torch section's (--gil-ms,
    # --gil-batches, --gil-epochs, --quick), so that the two sections read alike.
    return {**G.config(a), "skip": a.no_mx}


def _rows(mx, ds, first_loading):
    """The rows (name -> make); each fresh drop-in's stats().loading at the end of its first
    epoch is appended to ``first_loading``."""
    import prefetch.mx as pmx

    def gluon():
        return mx.gluon.data.DataLoader(ds, batch_size=G.BATCH, num_workers=2)

    def dropin():
        return pmx.DataLoader(ds, batch_size=G.BATCH, num_workers=2)

    def steady_dropin():
        dl = dropin()
        return dl, dl.close
    # Gluon's DataLoader has no close(): its worker pool ends with the loader.
    return {
        "plain loop": lambda: (G._Plain(ds), None),
        GLUON: lambda: (gluon(), None),
        GLUON_FIRST: lambda: (G._FirstEpoch(gluon), None),
        DROPIN: steady_dropin,
        DROPIN_FIRST: lambda: (G._FirstEpoch(dropin, lambda dl: first_loading.append(_loading(dl))), None),
    }


def _loading(dropin):
    """Where the drop-in loaded its last pass (stats().loading); what went wrong instead, if
    reading it raised (the table says so: the figures still stand)."""
    try:
        return dropin.stats().loading
    except Exception as e:  # noqa: BLE001 - a broken stats() must not cost the measured figures
        return f"unreadable ({type(e).__name__}: {e})"


def _loading_lines(steady, firsts):
    """Whether the drop-ins had handed loading to Gluon's worker processes when they were
    timed: the steady one after its timed epochs, each fresh one at the end of its first."""
    if steady == "processes":
        lines = [f"  {DROPIN} loaded in Gluon's worker processes after its hand-over (stats().loading: "
                 f"{steady!r})"]
    else:
        lines = [f"  NOT HANDED OVER: {DROPIN} reports stats().loading {steady!r} after its timed epochs, not "
                 f"'processes': its figures are its threads', not Gluon's worker pool's"]
    handed = firsts.count("processes")
    others = sorted(set(firsts) - {"processes"})
    lines.append(f"  fresh drop-ins: stats().loading 'processes' at the end of the first epoch in {handed} of "
                 f"{len(firsts)}" + (f" (the others: {', '.join(map(repr, others))}: those first epochs were "
                                     "loaded on threads to their end)" if others else ""))
    return lines


def run(cfg, say):
    mx, why = B.load_mx() if not cfg["skip"] else (None, "left out (--no-mx)")
    if mx is None:
        return {"tables": [f"  (not measured: {why})"], "verdicts": [], "data": {}, "skipped": why}
    ds, load_s = G.calibrated_texts(cfg)
    first_loading = []
    bps, loading = G.measure(_rows(mx, ds, first_loading), cfg, say, PAIRS, PAIRED,
                             lambda loaders: _loading(loaders[DROPIN]))
    lines, cpus = G.figure_lines(cfg, bps, GLUON, load_s)
    lines.append(G.first_epoch_line(cfg, bps, DROPIN_FIRST, GLUON_FIRST, "Gluon"))
    lines += _loading_lines(loading, first_loading)
    data = {"batches_per_s": bps, "load_s": load_s, "cpus": cpus, "base": GLUON, "loading": loading,
            "first_epoch_loading": first_loading}
    return {"tables": lines, "verdicts": G.judged(bps, PAIRS), "data": data}


def plot(ax, data):
    """Batches/s per row (median, bar: 95% interval); the serial limit of threads, the process
    ideal and the target line: GOAL x Gluon's DataLoader(num_workers=2), as the table judges it."""
    G.draw(ax, data, "the drop-in", "GIL-bound dataset on MXNet (pure-Python dataset[i])")
