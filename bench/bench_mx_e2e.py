"""Section 5: MXNet end to end: epoch time of a small Module.fit.

The workload lives in bench/bench_mx_fit.py (epoch_times(kinds, epochs, quick)
-> {kind: [seconds per epoch]}); this file only runs it when MXNet imports and
that file exists, and reports ratios to the no-prefetcher epoch time.

Run alone: python bench/bench_mx_e2e.py [--quick]
"""
from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U  # noqa: E402

KINDS = ("none", "mx", "prefetch")
LABELS = {"none": "no prefetcher", "mx": "mx.io.PrefetchingIter", "prefetch": "prefetch.mx.PrefetchingIter"}


def default_cfg(quick=False):
    return {"epochs": 2 if quick else 3, "quick": quick, "kinds": list(KINDS)}


def available():
    """(epoch_times function, None) or (None, reason)."""
    mx, why = U.load_mx()
    if mx is None:
        return None, why + " (install mxnet==1.9.1 with numpy<1.24 on Python <= 3.11 to run it)"
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(here, "bench_mx_fit.py")):
        return None, "bench/bench_mx_fit.py is missing"
    try:
        mod = importlib.import_module("bench_mx_fit")
        return mod.epoch_times, None
    except Exception as e:
        return None, f"bench_mx_fit failed to import ({type(e).__name__}: {str(e)[:100]})"


def steps(cfg):
    return 1


def run(cfg, prog=None):
    prog = prog or U.NullProgress()
    fn, why = available()
    res = {"params": dict(cfg), "skipped": {}, "epochs_s": {}, "summary": {}, "ratio_vs_none": {}}
    if fn is None:
        res["skipped"]["mxnet end-to-end"] = why
        prog.tick()
        return res
    prog.set("mxnet Module.fit epochs")
    try:
        with U.no_gc():
            times = fn(kinds=tuple(cfg["kinds"]), epochs=cfg["epochs"], quick=cfg["quick"])
    except Exception as e:
        res["skipped"]["mxnet end-to-end"] = f"epoch_times raised {type(e).__name__}: {str(e)[:200]}"
        prog.tick()
        return res
    prog.tick()
    res["epochs_s"] = {k: list(v) for k, v in times.items()}
    for k, v in times.items():
        # the first epoch carries start-up (graph bind, thread start); report it, rank on the rest
        steady = list(v[1:]) if len(v) > 1 else list(v)
        res["summary"][k] = U.summary(steady)
    if "none" in res["summary"]:
        base = res["summary"]["none"]["median"]
        res["ratio_vs_none"] = {k: s["median"] / base for k, s in res["summary"].items()}
    return res


def report(res):
    out = ["[5] MXNet end to end: Module.fit epoch time, s (epochs after the first), median ±half-IQR."]
    if res["summary"]:
        rows = [[LABELS.get(k, k), U.fmt(s, 3), f"{res['ratio_vs_none'].get(k, float('nan')):.3f}",
                 " ".join(f"{x:.3f}" for x in res["epochs_s"][k])] for k, s in res["summary"].items()]
        out += U.table_lines(["feeding", "epoch s", "vs none", "all epochs s"], rows)
    for k, why in res["skipped"].items():
        out.append(f"    (skipped {k}: {why})")
    return out


def main(argv=None):
    U.section_main(__doc__, default_cfg, run, report, argv=argv, options=[("epochs", int)])

if __name__ == "__main__":
    main()
