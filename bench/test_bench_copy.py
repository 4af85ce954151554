"""pytest-benchmark: copy throughput of one large leaf (--bench-sizes).

One round moves 8 batches; extra_info has the bytes per round so GB/s =
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
    _setup(benchmark, size)

    def run():
        with prefetch.Prefetcher(_gen(src, ROUNDS_BATCHES), depth=2, workers=workers) as p:
            for _b in p:
                pass
    benchmark.pedantic(run, rounds=7, iterations=1, warmup_rounds=1)
