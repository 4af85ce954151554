"""pytest-benchmark: hand-off of tiny batches (copy included for the safe rows).

One round = construct, consume --bench-n batches, close. Compare the groups
with `pytest bench/ --benchmark-group-by=group`.
"""
from __future__ import annotations

import pytest

import _util as U
from bench_handoff import tiny_batch

BATCH = tiny_batch()


def _src(n):
    for _ in range(n):
        yield BATCH


def _drain(it, n):
    cnt = 0
    for _b in it:
        cnt += 1
    U.close_quietly(it)
    assert cnt == n


def _bench(benchmark, make, n, group):
    benchmark.group = group
    benchmark.extra_info["batches_per_round"] = n
    benchmark.pedantic(lambda: _drain(make(), n), rounds=7, iterations=1, warmup_rounds=1)


def test_handoff_plain_loop(benchmark, n_batches):
    _bench(benchmark, lambda: iter(_src(n_batches)), n_batches, "handoff plain")


def test_handoff_queue_copy(benchmark, n_batches, depth):
    _bench(benchmark, lambda: U.QueuePrefetcher(_src(n_batches), depth, copy=True), n_batches,
           f"handoff depth={depth}")


def test_handoff_background_generator(benchmark, n_batches, depth):
    bg, why = U.load_bg()
    if bg is None:
        pytest.skip(why)
    _bench(benchmark, lambda: bg(_src(n_batches), max_prefetch=depth), n_batches, f"handoff depth={depth}")


def test_handoff_prefetch(benchmark, n_batches, depth, prefetch):
    _bench(benchmark, lambda: prefetch.Prefetcher(_src(n_batches), depth=depth), n_batches,
           f"handoff depth={depth}")
