"""pytest-benchmark: steady-state pool reuse over a long run of 4 MiB batches.

One Prefetcher, created outside the timing; each round consumes 50 batches
from it. extra_info records page faults per batch and the pool counters, so a
regression in reuse shows up next to the time in --benchmark-compare.
"""
from __future__ import annotations

import numpy as np

import _util as U

SIZE = 4 * 2**20
PER_ROUND = 50
ROUNDS = 10


def test_pool_reuse_steady_state(benchmark, prefetch):
    a = np.arange(SIZE // 4, dtype=np.float32)
    total = PER_ROUND * (ROUNDS + 2)

    def gen():
        for _ in range(total):
            yield a

    p = prefetch.Prefetcher(gen(), depth=4)
    try:
        for _ in range(PER_ROUND):  # warm the pool
            next(p)
        f0 = U.minflt()

        def run():
            for _ in range(PER_ROUND):
                next(p)
        benchmark.group = "pool reuse 4MiB"
        benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
        faults = (U.minflt() - f0) / (PER_ROUND * (ROUNDS + 1))
        st = p.stats()
        benchmark.extra_info.update(faults_per_batch=faults, blocks_allocated=st.blocks_allocated,
                                    blocks_reused=st.blocks_reused, bytes_per_round=SIZE * PER_ROUND)
    finally:
        p.close()
