"""The batch walk: prefetch's own tree walk beside optree and dm-tree.

Each batch is a nested structure of 10, 1,000 or 100,000 int leaves (groups of
ten in dicts, lists, tuples and namedtuples), so nothing is copied. "prefetch
walk" takes the batch apart and rebuilds it as the fetch thread does, timed
alone on one thread (through prefetch._core._walk: the one private call of the
benchmark, since Prefetcher cannot time its walk apart from the hand-off);
"optree" and "dm-tree" are their flatten + unflatten of the same batch. The
ratio is per repetition, rows interleaved. For scale, the whole cost per batch
of a Prefetcher over the same batches (walk, hand-off between two threads).
Also shown: how deep each walk goes and what each does with a batch that
contains itself.
"""
from __future__ import annotations

import collections
import os
import sys

import _stats as S
import _util as U
import numpy as np

TITLE = "Batch walk beside optree and dm-tree"

WALK = "prefetch walk (flatten + rebuild)"
OURS = "prefetch.Prefetcher, whole cost per batch"
OPTREE = "optree.tree_flatten + tree_unflatten"
DMTREE = "dm-tree flatten + unflatten_as"

Pair = collections.namedtuple("Pair", "a b")


def add_arguments(g):
    g.add_argument("--leaves", type=U.int_list, help="leaves per batch, e.g. 10,1000,100000")


def config(a):
    return {"leaves": getattr(a, "leaves", None) or [10, 1000, 100000],
            "reps": a.reps or (9 if a.quick else 15),
            "target_s": 0.03 if a.quick else 0.15, "n_min": 3, "n_max": 50000}


def make_batch(n):
    """A nested batch of n int leaves (n a multiple of 10, or below 10)."""
    def group(i):
        return {"x": (i, i + 1), "y": [i, i, i], "z": {"p": i, "q": i}, "n": Pair(i, i), "s": i}
    if n < 10:
        return list(range(n))
    groups = [group(i) for i in range(n // 10)]
    if len(groups) > 100:     # one more level: lists of 100 groups
        groups = [groups[i:i + 100] for i in range(0, len(groups), 100)]
    return groups


def _libs():
    from prefetch import _core
    libs, skipped = {WALK: lambda b: _core._walk(b)}, {}
    try:
        import optree
        libs[OPTREE] = lambda b: optree.tree_unflatten(*reversed(optree.tree_flatten(b, none_is_leaf=True)))
    except ImportError as e:
        skipped[OPTREE] = f"not installed ({e.name})"
    try:
        import tree
        libs[DMTREE] = lambda b: tree.unflatten_as(b, tree.flatten(b))
    except ImportError as e:
        skipped[DMTREE] = f"not installed ({e.name}; pip install dm-tree)"
    return libs, skipped


def _per_batch_prefetch_us(batch, n):
    import prefetch
    with U.no_gc():
        t0 = U.ns()
        with prefetch.Prefetcher(batch for _ in range(n)) as p:
            cnt = sum(1 for _ in p)
        t = U.ns() - t0
    if cnt != n:
        raise RuntimeError(f"expected {n} batches, got {cnt}")
    return t / n / 1e3


def _per_batch_fn_us(fn, batch, n):
    with U.no_gc():
        t0 = U.ns()
        for _ in range(n):
            fn(batch)
        t = U.ns() - t0
    return t / n / 1e3


def _limits(libs):
    """How many levels of list each walk takes, and what it does on a cycle."""
    import prefetch

    def deep(levels):
        o = 0
        for _ in range(levels):
            o = [o]
        return o

    def ours(b):
        with prefetch.Prefetcher([b]) as p:
            return next(p)

    cyc = [0]
    cyc.append(cyc)
    out = {}
    for name, fn in [("prefetch", ours)] + list(libs.items()):
        row = {}
        for levels in (1_000, 10_000, 100_000, 200_000):
            try:
                fn(deep(levels))
                row[f"{levels:,} levels"] = "ok"
            except Exception as e:  # noqa: BLE001 - what each library raises is the figure
                row[f"{levels:,} levels"] = type(e).__name__
        try:
            fn(cyc)
            row["a list holding itself"] = "no error (!)"
        except Exception as e:  # noqa: BLE001
            row["a list holding itself"] = f"{type(e).__name__}: {str(e)[:60]}"
        out[name] = row
    return out


def run(cfg, say):
    libs, skipped = _libs()
    if len(libs) == 1:   # the comparison is the point of the section: without a library, nothing to compare
        why = "; ".join(skipped.values()) or "neither optree nor dm-tree imports"
        return {"tables": [f"  (not measured: {why})"], "verdicts": [], "data": {}, "skipped": why}
    sizes = cfg["leaves"]
    batches = {k: make_batch(k) for k in sizes}
    rows = list(libs) + [OURS]
    others = [lib for lib in libs if lib != WALK]

    def measure(row, k, n):
        if row == OURS:
            return _per_batch_prefetch_us(batches[k], n)
        return _per_batch_fn_us(libs[row], batches[k], n)

    n = {}  # pilot: batches per measurement so that one takes about target_s
    for k in sizes:
        for row in rows:
            per = measure(row, k, 3)
            n[(row, k)] = max(cfg["n_min"], min(cfg["n_max"], int(cfg["target_s"] * 1e6 / max(per, 1e-3))))
    per_us = {row: {k: [] for k in sizes} for row in rows}
    for rep in range(cfg["reps"]):
        say(f"repetition {rep + 1}/{cfg['reps']}")
        for k in U.rotate(sizes, rep):
            for row in U.rotate(rows, rep):
                per_us[row][k].append(measure(row, k, n[(row, k)]))
    ratio = {lib: {k: S.interval(S.ratios(per_us[WALK][k], per_us[lib][k])) for k in sizes} for lib in others}

    hdr = ["µs per batch, median [95% interval]"] + [f"{k:,} leaves" for k in sizes]
    tab = [[row] + [S.interval(per_us[row][k]).text(2) for k in sizes] for row in rows]
    tab.append(["prefetch walk, ns per leaf"] + [S.interval([w * 1e3 / k for w in per_us[WALK][k]]).text(0)
                                                  for k in sizes])
    lines = U.table_lines(hdr, tab)
    lines += ["", "  ratio prefetch walk / library, per repetition (below 1: the walk is faster)"]
    lines += U.table_lines(["walk / library"] + [f"{k:,} leaves" for k in sizes],
                           [[f"walk / {lib.split()[0]}"] + [ratio[lib][k].text(2) for k in sizes] for lib in others])
    limits = _limits({lib: libs[lib] for lib in others})
    cols = list(next(iter(limits.values())))
    lines += ["", "  depth and cycles"]
    lines += U.table_lines(["walk"] + cols, [[name] + [row[c] for c in cols] for name, row in limits.items()])
    lines += [f"  (not measured: {k}: {why})" for k, why in skipped.items()]
    data = {"leaves": sizes, "per_batch_us": {r: {str(k): v for k, v in d.items()} for r, d in per_us.items()},
            "limits": limits, "skipped": skipped}
    return {"tables": lines, "verdicts": [], "data": data}


def plot(ax, data):
    leaves = data["leaves"]
    for row, by in data["per_batch_us"].items():
        ivs = [S.interval(by[str(k)]) for k in leaves]
        ax.errorbar(leaves, [iv.median for iv in ivs], yerr=np.array([iv.errbar() for iv in ivs]).T,
                    fmt="-o" if row.startswith("prefetch") else "--s", capsize=3, label=row)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("leaves per batch")
    ax.set_ylabel("µs per batch")
    ax.set_title("Batch walk (flatten + rebuild), lower is better\n(median, bars: 95% interval)")


def main(argv=None):
    """Standalone: this section alone through the harness (python bench/bench_tree.py [--quick])."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run as harness
    return harness.main(["--sections", "tree", "--no-plot"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
