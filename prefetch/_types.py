"""Small public types shared by the compiled core and the Python layer."""
from __future__ import annotations

from dataclasses import dataclass


class ClosedError(RuntimeError):
    """``next()`` was called on a prefetcher after ``close()``.

    A loop over a closed prefetcher must fail loudly, never end early.
    """


@dataclass(frozen=True)
class Stats:
    """A snapshot of a prefetcher's counters, taken by ``Prefetcher.stats()``.

    Attributes
    ----------
    produced, consumed : int
        Batches published by the fetch thread / handed to the consumer.
    bytes_copied : int
        Bytes of array data copied into pooled memory.
    consumer_wait_s : float
        Time the consumer spent waiting for a batch (the producer is the bottleneck).
    producer_wait_s : float
        Time the fetch thread spent waiting for room (the consumer is the bottleneck).
    fill, peak_fill : int
        Batches ready now / at most so far; never above ``depth``.
    depth : int
        The prefetcher's depth.
    blocks_allocated, blocks_reused : int
        Pool blocks freshly allocated / served again from the pool. In a steady
        state only ``blocks_reused`` grows.
    leaves_copied : int
        Array leaves (numpy or a registered type) copied.
    leaves_handed_over, bytes_handed_over : int
        Array leaves, and their bytes, handed over without a copy because only
        the prefetcher could reach them (``copy="auto"``).
        ``max_bytes`` counts these bytes as well as the copied ones.
    workers : int
        Loader threads in use (a ``Loader`` or ``map``; 0 for a ``Prefetcher``).
    samples : int
        Samples a loader's threads have finished, over every epoch.
    load_s : float
        Time spent inside ``dataset[i]`` (or map's function), summed over threads.
    loader_idle_s : float
        Time loader threads waited for room (the consumer is the bottleneck),
        summed over threads.
    bytes_collated : int
        Bytes the default collate copied into batch rows.
    """

    produced: int
    consumed: int
    bytes_copied: int
    consumer_wait_s: float
    producer_wait_s: float
    fill: int
    peak_fill: int
    depth: int
    blocks_allocated: int
    blocks_reused: int
    leaves_copied: int = 0
    leaves_handed_over: int = 0
    bytes_handed_over: int = 0
    workers: int = 0
    samples: int = 0
    load_s: float = 0.0
    loader_idle_s: float = 0.0
    bytes_collated: int = 0


@dataclass(frozen=True)
class WorkerInfo:
    """What ``prefetch.worker_info()`` returns on a loader thread.

    Attributes
    ----------
    id : int
        The thread's number, ``0 <= id < num_workers``, fixed for its life.
    num_workers : int
        Threads the loader had started when this one began its epoch.
    seed : int
        The loader's seed (drawn at random when none was given).
    epoch : int
        The epoch being loaded, from 0.
    """

    id: int
    num_workers: int
    seed: int
    epoch: int
