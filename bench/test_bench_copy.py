"""pytest-benchmark: copy throughput of one large leaf (--bench-sizes).

One round moves 8 batches (the Prefetcher is built and warmed up outside the
timing, as np.copyto's destination is); extra_info has the bytes per round so GB/s =
bytes_per_round / mean. The np.copyto row is the machine's single-thread limit.
"""
from __future__ import annotations

import numpy as np
import pytest

import _util as U

ROUNDS_BATCHES = 8


@pytest.fixture
def src(size):
    a = np.arange(size // 4, dtype=np.float32)
    return a


def _gen(a, n):
    for _ in range(n):
        yield a


def _setup(benchmark, size):
    benchmark.group = f"copy {U.human_bytes(size)}"
    benchmark.extra_info["bytes_per_round"] = size * ROUNDS_BATCHES


def test_copy_np_copyto(benchmark, src, size):
    dst = np.empty_like(src)
    np.copyto(dst, src)
    _setup(benchmark, size)

    def run():
        for _ in range(ROUNDS_BATCHES):
            np.copyto(dst, src)
    benchmark.pedantic(run, rounds=7, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_copy_prefetch(benchmark, src, size, workers, prefetch):
    """Steady state: one Prefetcher for the whole test, warmed up, 8 batches a round."""
    _setup(benchmark, size)
    rounds, warm = 7, 8
    p = prefetch.Prefetcher(_gen(src, (rounds + 1) * ROUNDS_BATCHES + warm), depth=2, workers=workers)
    try:
        for _ in range(warm):
            next(p)

        def run():
            for _ in range(ROUNDS_BATCHES):
                next(p)
        benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=1)
    finally:
        p.close()
