"""MXNet end to end: epoch time of a small Module.fit (the workload is in _mx_fit.py).

The three feeders run their epochs interleaved (epoch 1 of each, then epoch 2 of
each, ...), so the ratios pair epochs that ran at nearly the same time. The
first epoch carries start-up (graph bind, thread start) and is left out.
Runs only when MXNet imports.
"""
from __future__ import annotations

import importlib

import _baselines as B
import _stats as S
import _util as U

TITLE = "MXNet Module.fit epoch time"
MX_ROWS = True
LABELS = {"none": "no prefetcher (DataIter)", "mx": "mx.io.PrefetchingIter",
          "prefetch": "prefetch.mx.PrefetchingIter"}


def add_arguments(g):
    g.add_argument("--epochs", type=int, help="Module.fit epochs per feeder (the first is warm-up)")


def config(a):
    return {"epochs": a.epochs or (10 if a.quick else 16), "quick": a.quick, "skip": a.no_mx}


def run(cfg, say):
    mx, why = B.load_mx() if not cfg["skip"] else (None, "left out (--no-mx)")
    if mx is None:
        return {"tables": [f"  (not measured: {why})"], "verdicts": [], "data": {}, "skipped": why}
    say(f"{cfg['epochs']} epochs per feeder")
    epoch_times = importlib.import_module("_mx_fit").epoch_times
    with U.no_gc():
        times = epoch_times(epochs=cfg["epochs"], quick=cfg["quick"])
    steady = {k: v[1:] for k, v in times.items()}
    tab = [[LABELS[k], S.interval(v).text(3), S.interval(S.ratios(v, steady["none"])).text(3)]
           for k, v in steady.items()]
    lines = U.table_lines(["feeder", "s per epoch", "vs no prefetcher"], tab)
    return {"tables": lines, "verdicts": [], "data": {"epochs_s": times}}


def plot(ax, data):
    if not data:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "MXNet end to end: not measured (MXNet not importable)", ha="center")
        return
    ks = list(data["epochs_s"])
    ivs = [S.interval(data["epochs_s"][k][1:]) for k in ks]
    med = [iv.median for iv in ivs]
    for i, (k, m, iv) in enumerate(zip(ks, med, ivs)):   # one bar per feeder, labelled: its colour is the row's
        ax.bar([i], [m], yerr=[[e] for e in iv.errbar()], capsize=4, label=LABELS[k])
    ax.set_xticks(range(len(ks)), [LABELS[k].replace(" (", "\n(") for k in ks], fontsize=8)
    ax.set_ylabel("seconds per epoch")
    ax.set_title("MXNet Module.fit epoch time, lower is better\n(median, bars: 95% interval)")
