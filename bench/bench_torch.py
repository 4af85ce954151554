"""PyTorch tensors: hand-off cost, copy throughput, and a DataLoader with and without prefetch.

Tiny batches: a 4x8 float32 and a 4-element int64, as torch tensors and as numpy
arrays, from the same kind of generator; "extra cost" is a row's time per batch
minus its plain loop's in the same repetition, so the source's cost cancels.
19 MB: one float32 tensor handed out again and again (a source that refills one
buffer); prefetch's rows count the bytes the consumer received per second in
steady state, next to torch.Tensor.copy_ into one reused tensor (torch's own
threads). DataLoader: an epoch of 32 batches of 32 3x64x64 float32 images and
labels, the consumer spending about as long on each batch as the dataset does;
time per batch, worker start included. Hand-over: DataLoader(num_workers=0)
making 19 MB batches (32 3x224x224 float32 images and labels, fresh from
default_collate) and a consumer that does nothing with them (step 0): batches
per second through prefetch.Prefetcher over the bare loader's, and how many
leaves the prefetcher handed over instead of copying.

Run alone: python bench/bench_torch.py [--quick] [--reps N] (or through bench/run.py).
"""
from __future__ import annotations

import itertools
import os
import sys
import warnings

import _stats as S
import _util as U
import numpy as np

TITLE = "PyTorch tensors and DataLoader"

T_PLAIN = "torch tensors: plain loop"
T_OURS = "torch tensors: prefetch.Prefetcher"
N_PLAIN = "numpy arrays: plain loop"
N_OURS = "numpy arrays: prefetch.Prefetcher"
COPY_ = "torch.Tensor.copy_ into a reused tensor (limit)"
BIG1 = "prefetch.Prefetcher workers=1"
BIG2 = "prefetch.Prefetcher workers=2"
BIG_BYTES = 19_000_000
HO_BARE = "DataLoader(num_workers=0)"
HO_OURS = "prefetch.Prefetcher(DataLoader(num_workers=0))"
TINY_GOAL = 1.5   # torch's extra cost per tiny batch at most this times the numpy path's
BIG_GOAL = 0.9    # a 19 MB copy with workers=2 at least this times torch.Tensor.copy_


def add_arguments(g):
    g.add_argument("--torch-loader-batches", type=int, help="batches per DataLoader epoch (default 32)")


def config(a):
    return {"reps": a.reps or (9 if a.quick else 15), "target_s": 0.03 if a.quick else 0.12,
            "big_n": 8 if a.quick else 24, "loader_batches": getattr(a, "torch_loader_batches", None) or 32,
            "depth": 4, "handover_batches": 8 if a.quick else 16}


def _load_torch():
    try:
        import torch
    except ImportError as e:
        return None, f"torch does not import ({e}); pip install '.[torch]'"
    return torch, None


def _gen(batch, n):
    for _ in range(n):
        yield batch


def _per_batch_us(make, n):
    with U.no_gc():
        t0 = U.ns()
        it = make(n)
        cnt = sum(1 for _ in it)
        t = U.ns() - t0
    if hasattr(it, "close"):
        it.close()
    if cnt != n:
        raise RuntimeError(f"expected {n} batches, got {cnt}")
    return t / n / 1e3


def _tiny(cfg, torch, say):
    import prefetch
    nb = (np.arange(32, dtype=np.float32).reshape(4, 8), np.arange(4, dtype=np.int64))
    tb = tuple(torch.from_numpy(a.copy()) for a in nb)
    d = cfg["depth"]
    rows = {N_PLAIN: lambda n: _gen(nb, n), T_PLAIN: lambda n: _gen(tb, n),
            N_OURS: lambda n: prefetch.Prefetcher(_gen(nb, n), depth=d),
            T_OURS: lambda n: prefetch.Prefetcher(_gen(tb, n), depth=d)}
    n = {}
    for name, make in rows.items():   # pilot: N per row so that one measurement takes about target_s
        n[name] = max(200, min(100_000, int(cfg["target_s"] * 1e6 / max(_per_batch_us(make, 300), 1e-3))))
    us = {name: [] for name in rows}
    def unresolved():
        ratio = S.interval(S.ratios([a - b for a, b in zip(us[T_OURS], us[T_PLAIN])],
                                    [a - b for a, b in zip(us[N_OURS], us[N_PLAIN])]))
        return S.judge(ratio, TINY_GOAL, higher_is_better=False) == S.INCONCLUSIVE

    for rep in S.repetitions(cfg, unresolved, say, "tiny batches"):
        for name in U.rotate(list(rows), rep):
            us[name].append(_per_batch_us(rows[name], n[name]))
    extra = {T_OURS: [a - b for a, b in zip(us[T_OURS], us[T_PLAIN])],
             N_OURS: [a - b for a, b in zip(us[N_OURS], us[N_PLAIN])]}
    return us, extra, S.interval(S.ratios(extra[T_OURS], extra[N_OURS]))


def _big(cfg, torch, say):
    import prefetch
    src = torch.arange(BIG_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    n, d = cfg["big_n"], 2

    def copy_gbs():
        dst.copy_(src)   # warm
        t0 = U.ns()
        for _ in range(n):
            dst.copy_(src)
        return n * BIG_BYTES / (U.ns() - t0)

    def ours_gbs(workers):
        with prefetch.Prefetcher(itertools.repeat(src, n + d + 2), depth=d, workers=workers) as p:
            for _ in range(d + 2):   # steady state: the pool holds its blocks
                next(p)
            t0 = U.ns()
            for _ in range(n):
                next(p)
            return n * BIG_BYTES / (U.ns() - t0)

    rows = {COPY_: copy_gbs, BIG1: lambda: ours_gbs(1), BIG2: lambda: ours_gbs(2)}
    gbs = {name: [] for name in rows}
    def unresolved():
        return S.judge(S.interval(S.ratios(gbs[BIG2], gbs[COPY_])), BIG_GOAL, higher_is_better=True) == S.INCONCLUSIVE

    for rep in S.repetitions(cfg, unresolved, say, "19 MB copies"):
        for name in U.rotate(list(rows), rep):
            with U.no_gc():
                gbs[name].append(rows[name]())
    ratio = {name: S.interval(S.ratios(gbs[name], gbs[COPY_])) for name in (BIG1, BIG2)}
    return gbs, ratio


class _Images:
    """A map-style dataset: item i is a 3x64x64 float32 image made from i, and i."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        import torch
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 64, 64, generator=g), i


def _loader_rows(cfg, torch):
    from torch.utils.data import DataLoader

    import prefetch
    nb = cfg["loader_batches"]
    pins = [False, True] if torch.cuda.is_available() else [False]

    def loader(workers, pin):
        return DataLoader(_Images(), batch_size=32, num_workers=workers, pin_memory=pin)

    w = torch.rand(64, 64)

    def epoch(workers, pin, ours):
        def run():
            src = loader(workers, pin)
            it = prefetch.Prefetcher(src, depth=cfg["depth"]) if ours else iter(src)
            t0 = U.ns()
            for k, (x, _y) in enumerate(it):
                (x @ w).sum()   # the step: about as long as loading the batch
                if k + 1 == nb:
                    break
            t = U.ns() - t0
            if ours:
                it.close()
            del it
            return t / nb / 1e3
        return run

    rows = {}
    for workers, pin in itertools.product((0, 2), pins):
        label = f"DataLoader(num_workers={workers}, pin_memory={pin})"
        rows[label] = epoch(workers, pin, False)
        rows[f"prefetch.Prefetcher({label})"] = epoch(workers, pin, True)
    skipped = {} if len(pins) == 2 else {"pin_memory=True rows": "no CUDA here: pin_memory does nothing without an accelerator"}
    return rows, skipped


def _loader(cfg, torch, say):
    rows, skipped = _loader_rows(cfg, torch)
    us = {name: [] for name in rows}
    for rep in range(cfg["reps"]):
        say(f"DataLoader epochs {rep + 1}/{cfg['reps']}")
        for name in U.rotate(list(rows), rep):
            us[name].append(rows[name]())
    return us, skipped


class _Frames:
    """A map-style dataset: item i is a fresh 3x224x224 float32 image filled with i, and i."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        import torch
        return torch.full((3, 224, 224), float(i)), i


def _handover(cfg, torch, say):
    """Prefetcher(DataLoader) with a consumer that does nothing: default_collate builds
    every batch afresh, so the prefetcher hands its tensors over instead of copying them."""
    from torch.utils.data import DataLoader

    import prefetch
    nb = cfg["handover_batches"]
    counts = {}

    def epoch(ours):
        loader = DataLoader(_Frames(), batch_size=32)
        t0 = U.ns()
        it = prefetch.Prefetcher(loader, depth=cfg["depth"]) if ours else iter(loader)
        for k, _batch in enumerate(it):
            if k + 1 == nb:
                break
        t = U.ns() - t0
        if ours:
            st = it.stats()
            counts["handed"] = counts.get("handed", 0) + st.leaves_handed_over
            counts["copied"] = counts.get("copied", 0) + st.leaves_copied
            it.close()
        del it
        return t / nb / 1e3

    rows = {HO_BARE: lambda: epoch(False), HO_OURS: lambda: epoch(True)}
    us = {name: [] for name in rows}
    for rep in range(cfg["reps"]):
        say(f"DataLoader hand-over {rep + 1}/{cfg['reps']}")
        for name in U.rotate(list(rows), rep):
            us[name].append(rows[name]())
    # Batches per second, ours over the bare loader's: time per batch inverted.
    return us, S.interval(S.ratios(us[HO_BARE], us[HO_OURS])), counts


def run(cfg, say):
    torch, why = _load_torch()
    if torch is None:
        return {"tables": [f"  (not measured: {why})"], "verdicts": [], "data": {}, "skipped": why}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # pin_memory without an accelerator
        tiny_us, tiny_extra, tiny_ratio = _tiny(cfg, torch, say)
        big_gbs, big_ratio = _big(cfg, torch, say)
        loader_us, skipped = _loader(cfg, torch, say)
        ho_us, ho_ratio, ho_counts = _handover(cfg, torch, say)

    verdicts = [
        S.Verdict("torch tensors: extra cost per tiny batch <= 1.5 x the numpy path's",
                  f"ratio {tiny_ratio.text(2)} at depth {cfg['depth']}", S.judge(tiny_ratio, TINY_GOAL, higher_is_better=False)),
        S.Verdict("torch tensors: 19 MB copy >= 0.9 x torch.Tensor.copy_ into a reused tensor",
                  f"workers=2: {big_ratio[BIG2].text(2)}; workers=1: {big_ratio[BIG1].text(2)}",
                  S.judge(big_ratio[BIG2], BIG_GOAL, higher_is_better=True)),
        S.Verdict("torch DataLoader, step 0: Prefetcher >= 0.98 x the bare loader's batches/s, every leaf handed over",
                  f"{ho_ratio.text(2)}; leaves handed over {ho_counts['handed']}, copied {ho_counts['copied']}",
                  S.judge(ho_ratio, 0.98, higher_is_better=True) if ho_counts["copied"] == 0 else S.MISSED),
    ]
    lines = U.table_lines(["tiny batches, µs per batch", "median [95% interval]"],
                          [[name, S.interval(v).text(2)] for name, v in tiny_us.items()])
    lines += U.table_lines(["extra µs per batch over its plain loop", "median [95% interval]"],
                           [[name, S.interval(v).text(2)] for name, v in tiny_extra.items()]
                           + [["torch extra / numpy extra", tiny_ratio.text(2)]])
    lines += [""] + U.table_lines([f"{BIG_BYTES / 1e6:.0f} MB float32 tensor, GB/s", "median [95% interval]"],
                                  [[name, S.interval(v).text(2)] for name, v in big_gbs.items()]
                                  + [[f"{name} / copy_", iv.text(2)] for name, iv in big_ratio.items()])
    lines += [""] + U.table_lines([f"DataLoader epoch of {cfg['loader_batches']} batches, µs per batch", "median [95% interval]"],
                                  [[name, S.interval(v).text(0)] for name, v in loader_us.items()])
    lines += [f"  (not measured: {k}: {why})" for k, why in skipped.items()]
    lines += [""] + U.table_lines([f"19 MB batches, step 0, {cfg['handover_batches']} per epoch, µs per batch",
                                   "median [95% interval]"],
                                  [[name, S.interval(v).text(0)] for name, v in ho_us.items()]
                                  + [["Prefetcher batches/s / bare loader's", ho_ratio.text(2)]])
    lines += [f"  leaves handed over {ho_counts['handed']}, copied {ho_counts['copied']} (all repetitions)"]
    data = {"tiny_us": tiny_us, "tiny_extra_us": tiny_extra, "big_gbs": big_gbs, "loader_us": loader_us,
            "handover_us": ho_us, "handover_leaves": ho_counts,
            "skipped": skipped, "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    return {"tables": lines, "verdicts": verdicts, "data": data}


def plot(ax, data):
    """DataLoader epochs (the rows a user chooses between), µs per batch; the tiny-batch target alongside."""
    S.row_bars(ax, data["loader_us"], [r.replace("prefetch.Prefetcher(", "Prefetcher(\n") for r in data["loader_us"]],
               fontsize=7)
    ax.set_xlabel("µs per batch (DataLoader epoch, worker start included)")
    tiny = S.interval(S.ratios(data["tiny_extra_us"][T_OURS], data["tiny_extra_us"][N_OURS]))
    ax.set_title(f"PyTorch DataLoader epoch, lower is better (median, bars: 95% interval)\n"
                 f"tiny batches: torch extra cost / numpy path's {tiny.text(2)} (target: at most 1.5)")


if __name__ == "__main__":
    # Standalone: the harness's own report, JSON and summary, for this section alone.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run as harness
    if "torch" not in harness.SECTIONS:
        harness.SECTIONS.append("torch")
    sys.exit(harness.main(["--sections", "torch", "--no-plot", *sys.argv[1:]]))
