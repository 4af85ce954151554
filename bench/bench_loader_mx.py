"""Section: the image pipeline of the previous section, loaded with MXNet's loaders.

The same dataset (in-memory JPEGs, Pillow decode, random crop and flip, float32
normalise, CHW; batches of 32), the same protocol (each loader built once, its
first epoch thrown away, every figure an epoch timed right after an untimed one
consumed at the same pace, rows interleaved), at a GIL-free training step of half
the load time (and of 0 in a full run). Rows:

    plain loop                  dataset[i] per sample and np.stack, on the main thread
    Gluon DataLoader(2)         mx.gluon.data.DataLoader(num_workers=2): Gluon's default, processes
    Gluon DataLoader(2, threads)  the same with thread_pool=True
    prefetch.mx.DataLoader(2)   the Gluon drop-in (threads)

Batches come out as NDArrays from all three Gluon rows (Gluon's default collate).
The target is against the faster of the two Gluon rows. bench/main.sh runs this
section in its MXNet environment (mxnet 1.9.1, numpy 1.23.5) when the
benchmark's own environment has no mxnet.
"""
from __future__ import annotations

import bench_loader as L
import _baselines as B
import _stats as S

TITLE = "Image pipeline on MXNet: Gluon's DataLoader and the Gluon drop-in"
MX_ROWS = True

GLUON = "Gluon DataLoader(num_workers=2)"
GLUON_THREADS = "Gluon DataLoader(num_workers=2, thread_pool=True)"
OURS = "prefetch.mx.DataLoader(num_workers=2)"
GOAL = 1.10


def config(a):
    # Quick: 6 repetitions and no more: a quick run calls its target from the median, which
    # a Gluon worker process slow to wake in one repetition does not move.
    return {"reps": a.reps or (6 if a.quick else 10), "batches": a.loader_batches or (6 if a.quick else 12),
            "images": a.loader_images, "quick": a.quick, "skip": a.no_mx,
            "decide_s": 0.0 if a.reps or a.quick else 120.0, "decide_reps": 0 if a.reps else 30}


class _GluonImages:
    """The images as a Gluon dataset (Gluon's loaders take any object with __getitem__ and
    __len__; a subclass of its Dataset is what its documentation shows)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[i]


def _rows(mx, ds):
    import prefetch.mx as pmx
    gds = _GluonImages(ds)

    def ours():
        dl = pmx.DataLoader(gds, batch_size=L.BATCH, num_workers=2)
        return dl, getattr(dl, "close", None)
    return {
        L.PLAIN: lambda: (L._Reiter(lambda: L._plain(ds)), None),
        GLUON: lambda: (mx.gluon.data.DataLoader(gds, batch_size=L.BATCH, num_workers=2), None),
        GLUON_THREADS: lambda: (mx.gluon.data.DataLoader(gds, batch_size=L.BATCH, num_workers=2,
                                                         thread_pool=True), None),
        OURS: ours,
    }


def _best_gluon(bps_s):
    return max((GLUON, GLUON_THREADS), key=lambda k: S.interval(bps_s[k]).median)


def run(cfg, say):
    mx, why = B.load_mx() if not cfg["skip"] else (None, "left out (--no-mx)")
    if mx is None:
        return {"tables": [f"  (not measured: {why})"], "verdicts": [], "data": {}, "skipped": why}
    try:
        import PIL  # noqa: F401
    except ImportError:
        why = "Pillow is not installed: pip install pillow"
        return {"tables": [f"  (not measured: {why})"], "verdicts": [], "data": {}, "skipped": why}
    ds = L.Images(L.make_jpegs(cfg["images"]), cfg["batches"] * L.BATCH)
    load_s = L.load_time_s(ds)
    steps = {"step = load/2": load_s / 2} if cfg["quick"] else {"step 0": 0.0, "step = load/2": load_s / 2}
    bps = L.measure(_rows(mx, ds), steps, cfg, say, lambda bps, s: [(OURS, _best_gluon(bps[s]), GOAL)])

    verdicts, ratio_rows, claims = [], [], []
    for s in steps:
        best = _best_gluon(bps[s])
        iv = S.interval(S.ratios(bps[s][OURS], bps[s][best]))
        ratio_rows.append([f"{s}: {OURS} / {best}", iv.text(2)])
        ratio_rows.append([f"{s}: {OURS} / {L.PLAIN}", S.interval(S.ratios(bps[s][OURS], bps[s][L.PLAIN])).text(2)])
        verdicts.append(S.Verdict(f"image pipeline, {s}: {OURS} >= {GOAL:.2f} x the faster Gluon DataLoader's "
                                  "batches/s", f"{iv.text(2)} x {best}", S.judge(iv, GOAL, True)))
        if s == "step = load/2":
            claims.append(f"{OURS} {iv.text(2)} x {best}")
    lines = [f"  one batch loads in {load_s * 1e3:.0f} ms on one thread; epochs of {cfg['batches']} batches"]
    for s in steps:
        lines += [""] + L.U.table_lines([f"{s} ({steps[s] * 1e3:.0f} ms), batches/s", "median [95% interval]"],
                                        [[name, S.interval(v).text(1)] for name, v in bps[s].items()])
    lines += [""] + L.U.table_lines(["speed ratios per repetition (batches/s)", "median [95% interval]"], ratio_rows)
    return {"tables": lines, "verdicts": verdicts, "claims": claims,
            "data": {"batches_per_s": bps, "steps_s": steps, "load_s": load_s}}


def plot(ax, data):
    """Batches/s at step = load/2 per row (median, bar: 95% interval) and the target line:
    GOAL x the faster Gluon DataLoader, as the table judges it."""
    s = "step = load/2"
    rows = data["batches_per_s"][s]
    S.row_bars(ax, rows)
    best = _best_gluon(rows)
    ax.axvline(GOAL * S.interval(rows[best]).median, linestyle=":", color="k", linewidth=1.2,
               label=f"target: {GOAL:.2f} x {best}")
    ax.set_xlabel(f"batches/s at step = load/2 ({data['steps_s'][s] * 1e3:.0f} ms), higher is better")
    ax.set_title("Image pipeline on MXNet: batches per second, higher is better (median; bars: 95% interval)",
                 fontsize=10)
