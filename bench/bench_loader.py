"""Section: an image pipeline, loaded as a user would load it.

A map-style dataset of in-memory 256x256 JPEGs: Pillow decode, a random 224
crop and flip, float32 normalise, CHW; batches of 32 (19 MB). The training
step is a GIL-free wait (what a GPU step looks like to the host), of 0, about
half the time one batch takes to load on one thread, and about that whole
time. Every loader is built once and its first epoch thrown away, so the rows
compare steady epochs (torch's workers are persistent, as a long run would
set them). Rows, interleaved within each repetition:

    plain loop                  dataset[i] per sample and np.stack, on the main thread
    Prefetcher(thread map)      a hand-rolled ThreadPoolExecutor(2).map + np.stack, behind a Prefetcher
    torch DataLoader(2)         torch.utils.data.DataLoader(num_workers=2) (processes)
    prefetch.torch.DataLoader(2)  the drop-in: the same call on threads
    Gluon DataLoader(2, threads)  mx.gluon.data.DataLoader(num_workers=2, thread_pool=True)
    prefetch.mx.DataLoader(2)   the Gluon drop-in on threads
    Loader(workers=2), Loader(workers="auto")

Figures are batches per second of an epoch; verdicts are per-repetition ratios.
"""
from __future__ import annotations

import io
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import _stats as S
import _util as U

TITLE = "Image pipeline: decode, crop, normalise, batch (the loaders users reach for)"
HEADLINE = True

BATCH = 32
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1) * 255
INV_STD = (1 / (np.array([0.229, 0.224, 0.225], np.float32) * 255)).reshape(3, 1, 1)

LOADER2 = "prefetch.Loader(workers=2)"
LOADER_AUTO = 'prefetch.Loader(workers="auto")'


def add_arguments(g):
    g.add_argument("--loader-batches", type=int, default=None, help="batches per epoch (default 12; quick 8)")
    g.add_argument("--loader-images", type=int, default=64, help="distinct JPEGs in memory")


def config(a):
    return {"reps": a.reps or (6 if a.quick else 10), "batches": a.loader_batches or (8 if a.quick else 12),
            "images": a.loader_images, "quick": a.quick, "no_mx": getattr(a, "no_mx", False)}


class Images:
    """Map-style dataset: a decoded, augmented CHW float32 image and its label."""

    def __init__(self, jpegs, n):
        self.jpegs = jpegs
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from PIL import Image
        rng = np.random.default_rng(i)   # the same augmentation whichever loader runs it
        with Image.open(io.BytesIO(self.jpegs[i % len(self.jpegs)])) as img:
            a = np.asarray(img.convert("RGB"))
        y, x = rng.integers(0, 33, 2)
        a = a[y:y + 224, x:x + 224]
        if rng.random() < 0.5:
            a = a[:, ::-1]
        out = a.transpose(2, 0, 1).astype(np.float32)
        out -= MEAN
        out *= INV_STD
        return out, i % 1000


def make_jpegs(n):
    from PIL import Image
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:256, 0:256]
    out = []
    for k in range(n):
        base = np.stack([(xx * (k % 7 + 1)) % 256, (yy * (k % 5 + 1)) % 256, (xx + yy + 9 * k) % 256], -1)
        img = np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _chunks(n):
    return [list(range(s, min(s + BATCH, n))) for s in range(0, n, BATCH)]


def _plain(ds):
    for keys in _chunks(len(ds)):
        samples = [ds[i] for i in keys]
        yield np.stack([s[0] for s in samples]), np.array([s[1] for s in samples])


class _ThreadMap:
    """The hand-rolled pipeline: a ThreadPoolExecutor map and np.stack per batch, in a Prefetcher."""

    def __init__(self, ds):
        self.ds = ds
        self.pool = ThreadPoolExecutor(2)

    def __iter__(self):
        for keys in _chunks(len(self.ds)):
            samples = list(self.pool.map(self.ds.__getitem__, keys))
            yield np.stack([s[0] for s in samples]), np.array([s[1] for s in samples])

    def close(self):
        self.pool.shutdown()


def _rows(ds, cfg):
    """name -> (make: () -> (iterable over epochs, closer)); built once, before timing."""
    import prefetch
    rows = {"plain loop": lambda: (_Reiter(lambda: _plain(ds)), None)}

    def thread_map():
        tm = _ThreadMap(ds)
        p = prefetch.Prefetcher(tm, depth=4)
        return p, lambda: (p.close(), tm.close())
    rows["Prefetcher(ThreadPoolExecutor(2).map + np.stack)"] = thread_map
    skipped = {}
    try:
        import torch
        from torch.utils.data import DataLoader
        torch.set_num_threads(1)
        rows["torch DataLoader(num_workers=2)"] = lambda: (
            DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True), None)
        try:
            import prefetch.torch as ptorch
            if hasattr(ptorch, "DataLoader"):
                def ours_torch():
                    dl = ptorch.DataLoader(ds, batch_size=BATCH, num_workers=2)
                    return dl, getattr(dl, "close", None)
                rows["prefetch.torch.DataLoader(num_workers=2)"] = ours_torch
        except ImportError as e:
            skipped["prefetch.torch.DataLoader"] = str(e)
    except ImportError:
        skipped["torch rows"] = "torch is not installed (pip install 'prefetch-ring[torch]')"
    if not cfg["no_mx"] and os.environ.get("BENCH_MX", "0") == "1":
        try:
            import mxnet as mx
            rows["Gluon DataLoader(num_workers=2, thread_pool=True)"] = lambda: (
                mx.gluon.data.DataLoader(_GluonImages(ds), batch_size=BATCH, num_workers=2, thread_pool=True), None)
            import prefetch.mx as pmx
            if hasattr(pmx, "DataLoader"):
                def ours_mx():
                    dl = pmx.DataLoader(_GluonImages(ds), batch_size=BATCH, num_workers=2)
                    return dl, getattr(dl, "close", None)
                rows["prefetch.mx.DataLoader(num_workers=2)"] = ours_mx
        except ImportError as e:
            skipped["Gluon rows"] = f"mxnet not importable: {e}"
    else:
        skipped["Gluon rows"] = "run with BENCH_MX=1 (installs mxnet 1.9.1)"

    def loader(workers):
        def make():
            ld = prefetch.Loader(ds, batch_size=BATCH, workers=workers)
            return ld, ld.close
        return make
    rows[LOADER2] = loader(2)
    rows[LOADER_AUTO] = loader("auto")
    return rows, skipped


class _Reiter:
    def __init__(self, fn):
        self.fn = fn

    def __iter__(self):
        return iter(self.fn())


class _GluonImages:
    """The same images as a Gluon dataset (Gluon's loader needs one for thread_pool)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[i]


def _epoch_batches_per_s(loader, step_s):
    """One whole epoch (each loader's own end of epoch, so the next loop starts a new one)."""
    t0 = time.perf_counter()
    k = 0
    for _batch in loader:
        if step_s:
            time.sleep(step_s)   # the step: releases the GIL, as a GPU step does
        k += 1
    return k / (time.perf_counter() - t0)


def run(cfg, say):
    try:
        import PIL  # noqa: F401
    except ImportError:
        return {"tables": ["  (not measured: Pillow is not installed: pip install 'prefetch-ring[bench]')"],
                "verdicts": [], "data": {}}
    n = cfg["batches"] * BATCH
    ds = Images(make_jpegs(cfg["images"]), n)
    # The load time of one batch on one thread sets the steps: the fastest of
    # a few, after one to warm the decoder and the allocator.
    one = Images(ds.jpegs, BATCH)
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        for _ in _plain(one):
            pass
        times.append(time.perf_counter() - t0)
    load_s = min(times[1:])
    steps = {"step 0": 0.0, "step = load/2": load_s / 2, "step = load": load_s}
    if cfg["quick"]:
        del steps["step = load"]   # the step-bound target needs the longer run
    rows, skipped = _rows(ds, cfg)
    built = {}
    for name, make in rows.items():
        say(f"image pipeline: building {name}")
        built[name] = make()
        _epoch_batches_per_s(built[name][0], 0)   # warm: workers started, pools filled
    bps = {s: {name: [] for name in rows} for s in steps}

    def unresolved():
        s = "step = load/2"
        others = [k for k in bps[s] if not k.startswith("prefetch.")]
        best = max(others, key=lambda k: S.interval(bps[s][k]).median)
        iv = S.interval(S.ratios(bps[s][LOADER2], bps[s][best]))
        return S.judge(iv, 1.10, True) == S.INCONCLUSIVE

    try:
        for rep in S.repetitions(cfg, unresolved, say, "image pipeline"):
            for s, step_s in steps.items():
                for name in U.rotate(list(rows), rep):
                    bps[s][name].append(_epoch_batches_per_s(built[name][0], step_s))
    finally:
        for loader, closer in built.values():
            if closer is not None:
                closer()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ideal = {s: min(1 / st if st else math.inf, cpus / load_s) for s, st in steps.items()}

    verdicts, ratio_rows, best_other = [], [], {}
    for s in steps:
        others = {k: v for k, v in bps[s].items() if not k.startswith("prefetch.")}
        best = max(others, key=lambda k: S.interval(others[k]).median)
        best_other[s] = best
        for ours in (LOADER2, LOADER_AUTO):
            iv = S.interval(S.ratios(bps[s][ours], others[best]))
            ratio_rows.append([f"{s}: {ours} / {best}", iv.text(2)])
            if s != "step = load":
                verdicts.append(S.Verdict(f"image pipeline, {s}: {ours} >= 1.10 x the best other loader",
                                          f"{iv.text(2)} x {best}", S.judge(iv, 1.10, True)))
        if s == "step = load" and not cfg["quick"]:
            for ours in (LOADER2, LOADER_AUTO):
                iv = S.interval([x / ideal[s] for x in bps[s][ours]])
                ratio_rows.append([f"{s}: {ours} / ideal 1/step", iv.text(2)])
                verdicts.append(S.Verdict(f"image pipeline, step = load time: {ours} >= 0.95 x the ideal 1/step",
                                          f"{iv.text(2)} x {ideal[s]:.1f} batches/s", S.judge(iv, 0.95, True)))
        for name in ("prefetch.torch.DataLoader(num_workers=2)", "prefetch.mx.DataLoader(num_workers=2)"):
            base = {"prefetch.torch.DataLoader(num_workers=2)": ("torch DataLoader(num_workers=2)", 1.25),
                    "prefetch.mx.DataLoader(num_workers=2)": ("Gluon DataLoader(num_workers=2, thread_pool=True)", 1.10)}[name]
            if name in bps[s] and base[0] in bps[s] and s == "step = load/2":
                iv = S.interval(S.ratios(bps[s][name], bps[s][base[0]]))
                ratio_rows.append([f"{s}: {name} / {base[0]}", iv.text(2)])
                verdicts.append(S.Verdict(f"image pipeline, {s}: {name} >= {base[1]:.2f} x {base[0]}",
                                          iv.text(2), S.judge(iv, base[1], True)))

    lines = [f"  one batch ({BATCH} x 3x224x224 float32, {BATCH * 3 * 224 * 224 * 4 / 1e6:.0f} MB) loads in "
             f"{load_s * 1e3:.0f} ms on one thread; {cpus} CPUs; epochs of {cfg['batches']} batches"]
    for s in steps:
        lines += [""] + U.table_lines([f"{s} ({steps[s] * 1e3:.0f} ms), batches/s", "median [95% interval]"],
                                      [[name, S.interval(v).text(1)] for name, v in bps[s].items()]
                                      + [["ideal: min(1/step, CPUs/load)", f"{ideal[s]:.1f}"]])
    lines += [""] + U.table_lines(["ratios per repetition", "median [95% interval]"], ratio_rows)
    lines += [f"  (not measured: {k}: {why})" for k, why in skipped.items()]
    # Time per epoch, ours / the fastest other loader's: the harness words it as "k x faster".
    s = "step = load/2"
    headline = S.Headline(LOADER2, f"{best_other[s]}, the fastest other loader here",
                          "on an image pipeline (JPEG decode, crop, normalise; batches of 32; "
                          "a GIL-free training step of half the load time)",
                          S.interval(S.ratios(bps[s][best_other[s]], bps[s][LOADER2])))
    data = {"batches_per_s": bps, "steps_s": steps, "load_s": load_s, "ideal": ideal, "skipped": skipped,
            "best_other": best_other}
    return {"tables": lines, "verdicts": verdicts, "data": data, "headline": headline}


def plot(ax, data):
    s = "step = load/2"
    rows = data["batches_per_s"][s]
    names = list(rows)
    med = [float(np.median(rows[n])) for n in names]
    for i, (name, m) in enumerate(zip(names, med)):
        ax.barh(i, m, label=name)   # labelled: the harness gives each row its colour
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.axvline(data["ideal"][s], linestyle="--", color="k", linewidth=0.8, label="ideal: min(1/step, CPUs/load)")
    ax.set_xlabel("batches/s (step = load/2)")
    ax.set_title("Image pipeline", fontsize=8)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run as harness
    if "loader" not in harness.SECTIONS:
        harness.SECTIONS.insert(0, "loader")
    sys.exit(harness.main(["--sections", "loader", "--no-plot", *sys.argv[1:]]))
