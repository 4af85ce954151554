"""MXNet at engine speed (issue 9): µs per batch from an mx.io.NDArrayIter.

Rows, interleaved in one process (each repetition rotates their order):
plain loop, plain loop + one engine copyto() into a reused NDArray,
mx.io.PrefetchingIter, prefetch.mx.PrefetchingIter at depth 1 and 4.
The consumer only waits for batch.data[0] (wait_to_read), so the rows
measure what feeding costs.  "extra" = row - plain loop, same repetition.

Run alone: python bench/bench_mx_engine.py [--quick] [--reps N]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = [(64, 10), (64, 3, 64, 64), (32, 3, 224, 224)]
PLAIN, COPY, MXPF, OURS1, OURS4 = ("plain loop", "plain + one engine copyto()",
                                   "mx.io.PrefetchingIter", "prefetch.mx depth 1",
                                   "prefetch.mx depth 4")
ROWS = [PLAIN, COPY, MXPF, OURS1, OURS4]


def _mx():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import mxnet as mx
    return mx


def source(mx, shape, nbatches):
    data = mx.nd.random.uniform(shape=(shape[0] * nbatches,) + tuple(shape[1:]))
    data.wait_to_read()
    return mx.io.NDArrayIter(data, batch_size=shape[0])


def one(mx, row, shape, nbatches):
    """Seconds per batch for one pass of ``row`` over a fresh source."""
    it = source(mx, shape, nbatches)
    dst = mx.nd.empty(shape) if row == COPY else None
    if row == MXPF:
        it = mx.io.PrefetchingIter(it)
    elif row in (OURS1, OURS4):
        import prefetch.mx as pmx
        it = pmx.PrefetchingIter(it, depth=1 if row == OURS1 else 4)
    mx.nd.waitall()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    n = 0
    for batch in it:
        x = batch.data[0]
        if dst is not None:
            x.copyto(dst)
            x = dst
        x.wait_to_read()
        n += 1
    t = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    if row == MXPF:
        it.__del__()  # mx's class keeps its thread otherwise
    elif hasattr(it, "close"):
        it.close()
    assert n == nbatches, (row, n)
    return t / n, faults / n


def run(shapes=SHAPES, reps=5, target_s=0.3, rows=ROWS):
    mx = _mx()
    out = {}
    for shape in shapes:
        # batches per pass: about target_s on the plain loop, 20..3000
        per = one(mx, PLAIN, shape, 20)[0]
        nb = max(20, min(3000, int(target_s / per)))
        times = {r: [] for r in rows}
        faults = {r: [] for r in rows}
        for rep in range(reps):
            order = rows[rep % len(rows):] + rows[:rep % len(rows)]
            for r in order:
                t, f = one(mx, r, shape, nb)
                times[r].append(t * 1e6)
                faults[r].append(f)
        out[shape] = (nb, times, faults)
    return out


def report(out):
    lines = []
    for shape, (nb, times, faults) in out.items():
        plain = times.get(PLAIN)
        lines.append(f"source NDArrayIter batch {shape}, {nb} batches/pass, µs per batch "
                     "(median [min..max]; extra = row - plain, same rep)")
        for r, xs in times.items():
            med = statistics.median(xs)
            txt = f"  {r:30s} {med:9.1f} [{min(xs):.1f}..{max(xs):.1f}]"
            if plain and r != PLAIN:
                extra = [a - b for a, b in zip(xs, plain)]
                txt += f"   extra {statistics.median(extra):8.1f}  ratio {med / statistics.median(plain):.3f}"
            else:
                txt += " " * 37
            txt += f"  faults/batch {statistics.median(faults[r]):7.1f}"
            lines.append(txt)
        if COPY in times and OURS4 in times:
            c, o1, o4 = (statistics.median(times[k]) for k in (COPY, OURS1, OURS4))
            lines.append(f"  ours / (plain + copy): depth 1 {o1 / c:.3f}, depth 4 {o4 / c:.3f}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--shapes", default=None, help="e.g. 64x10,32x3x224x224")
    a = ap.parse_args(argv)
    shapes = SHAPES if a.shapes is None else [
        tuple(int(d) for d in s.split("x")) for s in a.shapes.split(",")]
    reps = a.reps or (3 if a.quick else 5)
    out = run(shapes, reps, 0.1 if a.quick else 0.3)
    print("\n".join(report(out)))


if __name__ == "__main__":
    main()
