"""Section: an image pipeline, loaded as a user would load it.

A map-style dataset of in-memory 256x256 JPEGs: Pillow decode, a random 224
crop and flip, float32 normalise, CHW; batches of 32 (19 MB). The training
step is a GIL-free wait (what a GPU step looks like to the host), of 0, about
half the time one batch takes to load on one thread, and about that whole
time (--quick: half the load time only, and no workers="auto" row). Every loader is built once and its first epoch thrown away, so the rows
compare steady epochs (torch's workers are persistent, as a long run would
set them). Each figure is an epoch timed right after an untimed one consumed at
the same pace, so a loader that loads ahead across epochs is timed on what it
keeps ahead in a training loop, not on a backlog built while other rows ran.
Rows, interleaved within each repetition:

    plain loop                  dataset[i] per sample and np.stack, on the main thread
    Prefetcher(thread map)      a hand-rolled ThreadPoolExecutor(2).map + np.stack, behind a Prefetcher
                                (prefetch around a thread pool: shown, never "the fastest other loader")
    torch DataLoader(2)         torch.utils.data.DataLoader(num_workers=2) (processes)
    SPDL, torchdata.nodes, Grain  the thread loaders a user would try, each on 2 threads, set up
                                as its documentation recommends for a map-style dataset:
                                SPDL's DataLoader (sampler indices -> its pipeline: dataset[i]
                                on 2 threads, in order -> aggregate(32) -> collate), one
                                pipeline per epoch,
                                torchdata.nodes' migration recipe (Batcher(32) ->
                                ParallelMapper(map and collate, 2, method="thread") ->
                                Prefetcher -> Loader), Grain's MapDataset.source(ds).batch(32)
                                .to_iter_dataset(ReadOptions(num_threads=2)); a peer that is not
                                installed is a row saying so
    prefetch.torch.DataLoader(2)  the drop-in: the same call (persistent workers too) on threads
    Loader(workers=2), Loader(workers="auto")

Figures are batches per second of an epoch; verdicts are per-repetition ratios.
Gluon's DataLoader and the Gluon drop-in: the next section (bench_loader_mx.py).
"""
from __future__ import annotations

import io
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import _peers as P
import _stats as S
import _util as U

TITLE = "Image pipeline: decode, crop, normalise, batch (the loaders users reach for)"
HEADLINE = True

BATCH = 32
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1) * 255
INV_STD = (1 / (np.array([0.229, 0.224, 0.225], np.float32) * 255)).reshape(3, 1, 1)

PLAIN = "plain loop"
LOADER2 = "prefetch.Loader(workers=2)"
TORCH_DL = "torch DataLoader(num_workers=2)"
TORCH_OURS = "prefetch.torch.DataLoader(num_workers=2)"
LOADER_AUTO = 'prefetch.Loader(workers="auto")'
THREAD_MAP = "Prefetcher(ThreadPoolExecutor(2).map + np.stack)"   # prefetch around a thread pool: not another loader
GOAL = 1.10   # prefetch.Loader against the fastest other loader, batches/s


def add_arguments(g):
    g.add_argument("--loader-batches", type=int, default=None, help="batches per epoch (default 12; quick 6)")
    g.add_argument("--loader-images", type=int, default=64, help="distinct JPEGs in memory")


def config(a):
    # decide_s / decide_reps: the cap on the repetitions of the headline pair alone while its
    # interval straddles the target (none beyond an explicit --reps, as for every section; none
    # in --quick, which calls a target from its median: more repetitions barely move it)
    return {"reps": a.reps or (6 if a.quick else 10), "batches": a.loader_batches or (6 if a.quick else 12),
            "images": a.loader_images, "quick": a.quick,
            "decide_s": 0.0 if a.reps or a.quick else 120.0, "decide_reps": 0 if a.reps else 30}


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


def collate(samples):
    """What the hand-rolled rows and the peers do with a batch's samples (np.stack, labels array)."""
    return np.stack([s[0] for s in samples]), np.array([s[1] for s in samples])


def _plain(ds):
    for keys in _chunks(len(ds)):
        yield collate([ds[i] for i in keys])


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
    rows = {PLAIN: lambda: (_Reiter(lambda: _plain(ds)), None)}

    def thread_map():
        tm = _ThreadMap(ds)
        p = prefetch.Prefetcher(tm, depth=4)
        return p, lambda: (p.close(), tm.close())
    if not cfg["quick"]:   # prefetch around a thread pool: no loader a user would pick instead
        rows[THREAD_MAP] = thread_map
    skipped = {}
    try:
        import torch
        from torch.utils.data import DataLoader
        torch.set_num_threads(1)
        rows[TORCH_DL] = lambda: (
            DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True), None)
        try:
            import prefetch.torch as ptorch
            if hasattr(ptorch, "DataLoader"):
                def ours_torch():
                    dl = ptorch.DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
                    return dl, getattr(dl, "close", None)
                rows[TORCH_OURS] = ours_torch
        except ImportError as e:
            skipped["prefetch.torch.DataLoader"] = str(e)
    except ImportError:
        skipped["torch rows"] = "torch is not installed (pip install 'torch>=2.13')"
    peers, missing = P.rows(ds, BATCH, collate)
    rows.update(peers)
    skipped.update(missing)
    rows[LOADER2] = P.prefetch_loader(ds, BATCH, 2)
    if not cfg["quick"]:
        rows[LOADER_AUTO] = P.prefetch_loader(ds, BATCH, "auto")
    return rows, skipped


class _Reiter:
    def __init__(self, fn):
        self.fn = fn

    def __iter__(self):
        return iter(self.fn())


def _epoch_batches(loader, step_s):
    """One whole epoch (each loader's own end of epoch, so the next loop starts a new one): its batches."""
    k = 0
    for _batch in loader:
        if step_s:
            time.sleep(step_s)   # the step: releases the GIL, as a GPU step does
        k += 1
    return k


def steady_epoch_batches_per_s(loader, step_s, epochs=1):
    """Batches per second over ``epochs`` epochs right after another one consumed at the same
    pace, as in a training run.

    Rows are interleaved, so between two of a loader's measurements the other rows run; a
    loader that keeps loading ahead across epochs (SPDL's continuous source, a Loader loading
    the next epoch's first batches) would fill its buffers meanwhile and be timed on a backlog.
    The untimed epoch drains whatever was loaded ahead; the timed ones start with no more
    loaded ahead than the loader keeps while a training loop consumes it. Several timed epochs
    make one figure where an epoch is short against the machine's scheduling noise.
    """
    _epoch_batches(loader, step_s)
    t0 = time.perf_counter()
    k = sum(_epoch_batches(loader, step_s) for _ in range(epochs))
    return k / (time.perf_counter() - t0)


def alternating_batches_per_s(loaders, step_s, epochs):
    """Batches per second of each of ``loaders`` (name -> loader) over ``epochs`` epochs
    each, after an untimed one each, their timed epochs taken in turn: the machine's
    speed drifts over seconds (a shared host), and in turn the drift falls on every
    loader alike, so the ratios between them stay paired (rows measured one after
    another, seconds apart, are not)."""
    for loader in loaders.values():
        _epoch_batches(loader, step_s)
    batches = dict.fromkeys(loaders, 0)
    seconds = dict.fromkeys(loaders, 0.0)
    for _ in range(epochs):
        for name, loader in loaders.items():
            t0 = time.perf_counter()
            batches[name] += _epoch_batches(loader, step_s)
            seconds[name] += time.perf_counter() - t0
    return {name: batches[name] / seconds[name] for name in loaders}


def dropin_pairs(bps, s):
    """The torch drop-in's targets at step s: (ours, other, goal) against torch's
    DataLoader, and against the Loader it runs on (the same engine: within 5 %)."""
    if s == "step = load" or TORCH_OURS not in bps[s]:
        return []
    return [(TORCH_OURS, other, goal) for other, goal in ((TORCH_DL, 1.25), (LOADER2, 0.95))
            if other in bps[s]]


def load_time_s(ds):
    """One batch's load time on one thread, which sets the steps: the fastest of a few, after
    one to warm the decoder and the allocator."""
    one = Images(ds.jpegs, BATCH)
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        for _ in _plain(one):
            pass
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def measure(rows, steps, cfg, say, pairs):
    """Batches/s of every row at every step: each loader built once and warmed, rows
    interleaved within each repetition. Then, while the interval of a judged pair's ratio
    (pairs(bps, step): [(ours, other, goal)]) straddles its goal, just the rows of the open
    pairs are repeated (still interleaved) within cfg's time cap, so a quick run resolves
    the verdicts it states. Every loader is closed before it returns."""
    built = {}
    try:
        for name, make in rows.items():
            say(f"image pipeline: building {name}")
            built[name] = make()
            _epoch_batches(built[name][0], 0)   # warm: workers started, pools filled
        bps = {s: {name: [] for name in rows} for s in steps}
        def open_rows():
            """Per step, the rows of the pairs whose interval still straddles their goal."""
            todo = {}
            for s in steps:
                for ours, other, goal in pairs(bps, s):
                    if S.judge(S.interval(S.ratios(bps[s][ours], bps[s][other])), goal, True) == S.INCONCLUSIVE:
                        todo.setdefault(s, []).extend(r for r in (ours, other) if r not in todo.get(s, []))
            return todo

        for rep in S.repetitions(cfg, lambda: False, say, "image pipeline"):
            for s, step_s in steps.items():
                for name in U.rotate(list(rows), rep):
                    bps[s][name].append(steady_epoch_batches_per_s(built[name][0], step_s))
        deadline, extra = time.monotonic() + cfg["decide_s"], 0
        while (todo := open_rows()) and time.monotonic() < deadline and extra < cfg["decide_reps"]:
            say(f"image pipeline: deciding {', '.join(todo)} (repetition {extra + 1}, at most "
                f"{cfg['decide_reps']} or {cfg['decide_s']:.0f} s)")
            for s, names in todo.items():
                for name in U.rotate(names, extra):
                    bps[s][name].append(steady_epoch_batches_per_s(built[name][0], steps[s]))
            # (a ratio pairs two rows' values by repetition number: rows repeated together
            # stay paired, and zip() leaves out what one of them did not repeat)
            extra += 1
        return bps
    finally:
        for _loader, closer in built.values():
            if closer is not None:
                closer()


def is_other(row):
    """A loader a user would pick instead of prefetch's (the thread-map row is prefetch
    around a thread pool, so it is not one)."""
    return not row.startswith("prefetch.") and row != THREAD_MAP


def best_other(bps_s):
    """The fastest loader a user would pick instead (by median)."""
    return max([k for k in bps_s if is_other(k)], key=lambda k: S.interval(bps_s[k]).median)


def run(cfg, say):
    try:
        import PIL  # noqa: F401
    except ImportError:
        return {"tables": ["  (not measured: Pillow is not installed: pip install Pillow)"],
                "verdicts": [], "data": {}}
    n = cfg["batches"] * BATCH
    ds = Images(make_jpegs(cfg["images"]), n)
    load_s = load_time_s(ds)
    steps = {"step 0": 0.0, "step = load/2": load_s / 2, "step = load": load_s}
    if cfg["quick"]:   # the headline's step only: a quick run decides that one comparison
        steps = {"step = load/2": load_s / 2}
    rows, skipped = _rows(ds, cfg)
    # The verdicts decide: while an interval straddles its target, repeat just that pair
    # within a time cap. (A GILBoundWarning here is counted by bench/run.py, with every
    # other section's.)
    def pairs(bps, s):
        if s == "step = load":
            return []
        return [(LOADER2, best_other(bps[s]), GOAL)] + dropin_pairs(bps, s)
    bps = measure(rows, steps, cfg, say, pairs)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ideal = {s: min(1 / st if st else math.inf, cpus / load_s) for s, st in steps.items()}

    verdicts, ratio_rows, best, head = [], [], {}, {}
    s = "step = load/2"   # the headline's step: a plain loop's figure leads what else it says
    claims = [f"{S.interval(S.ratios(bps[s][LOADER2], bps[s][PLAIN])).text(2)} x a plain loop"]
    for s in steps:
        others = {k: v for k, v in bps[s].items() if is_other(k)}
        best[s] = best_other(bps[s])
        for ours in [r for r in (LOADER2, LOADER_AUTO) if r in bps[s]]:
            iv = S.interval(S.ratios(bps[s][ours], others[best[s]]))
            ratio_rows.append([f"{s}: {ours} / {best[s]}", iv.text(2)])
            if s != "step = load":
                v = S.Verdict(f"image pipeline, {s}: {ours} >= {GOAL:.2f} x the fastest other loader's batches/s",
                              f"{iv.text(2)} x {best[s]}", S.judge(iv, GOAL, True))
                verdicts.append(v)
                if ours == LOADER2:
                    head[s] = (iv, v)
        if s == "step = load" and not cfg["quick"]:
            for ours in (LOADER2, LOADER_AUTO):
                iv = S.interval([x / ideal[s] for x in bps[s][ours]])
                ratio_rows.append([f"{s}: {ours} / ideal 1/step", iv.text(2)])
                verdicts.append(S.Verdict(f"image pipeline, step = load time: {ours} >= 0.97 x the ideal 1/step",
                                          f"{iv.text(2)} x {ideal[s]:.1f} batches/s", S.judge(iv, 0.97, True)))
        for ours, other, goal in dropin_pairs(bps, s):
            iv = S.interval(S.ratios(bps[s][ours], bps[s][other]))
            ratio_rows.append([f"{s}: {ours} / {other}", iv.text(2)])
            verdicts.append(S.Verdict(f"image pipeline, {s}: {ours} >= {goal:.2f} x {other}'s batches/s",
                                      iv.text(2), S.judge(iv, goal, True)))
            if s == "step = load/2" and other == TORCH_DL:
                claims.append(f"{ours} {iv.text(2)} x {other}")

    lines = [f"  one batch ({BATCH} x 3x224x224 float32, {BATCH * 3 * 224 * 224 * 4 / 1e6:.0f} MB) loads in "
             f"{load_s * 1e3:.0f} ms on one thread; {cpus} CPUs; epochs of {cfg['batches']} batches"]
    absent = [[name, why.split(" (")[0] + " (" + why.split(" (", 1)[1].split(";")[0] + ")"]
              for name, why in skipped.items() if name in P.PEERS]
    for s in steps:
        lines += [""] + U.table_lines([f"{s} ({steps[s] * 1e3:.0f} ms), batches/s", "median [95% interval]"],
                                      [[name, S.interval(v).text(1)] for name, v in bps[s].items()] + absent
                                      + [["ideal: min(1/step, CPUs/load)", f"{ideal[s]:.1f}"]])
    lines += [""] + U.table_lines(["speed ratios per repetition (batches/s)", "median [95% interval]"], ratio_rows)
    lines += [f"  (not measured: {k}: {why})" for k, why in skipped.items() if k not in P.PEERS]
    s = "step = load/2"
    headline = S.Headline(LOADER2, f"{best[s]}, the fastest other loader here",
                          "on an image pipeline (JPEG decode, crop, normalise; batches of 32; "
                          "a GIL-free training step of half the load time)", head[s][0], verdict=head[s][1],
                          name=best[s], role="the fastest other loader", where="image pipeline", goal=GOAL)
    data = {"batches_per_s": bps, "steps_s": steps, "load_s": load_s, "ideal": ideal, "skipped": skipped,
            "best_other": best}
    return {"tables": lines, "verdicts": verdicts, "data": data, "headline": headline, "claims": claims}


def plot(ax, data):
    """Batches/s at step = load/2 per row (median, bar: 95% interval), the ideal and the target line."""
    s = "step = load/2"
    rows = data["batches_per_s"][s]
    S.row_bars(ax, rows)
    ax.axvline(data["ideal"][s], linestyle="--", color="k", linewidth=0.8, label="ideal: min(1/step, CPUs/load)")
    best = data.get("best_other", {}).get(s)
    if best in rows:
        ax.axvline(GOAL * S.interval(rows[best]).median, linestyle=":", color="k", linewidth=1.2,
                   label=f"target: {GOAL:.2f} x {best}")
    ax.set_xlabel(f"batches/s at step = load/2 ({data['steps_s'][s] * 1e3:.0f} ms), higher is better")
    ax.set_title("Image pipeline: batches per second, higher is better (median; bars: 95% interval)", fontsize=10)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run as harness
    if "loader" not in harness.SECTIONS:
        harness.SECTIONS.insert(0, "loader")
    sys.exit(harness.main(["--sections", "loader", "--no-plot", *sys.argv[1:]]))
