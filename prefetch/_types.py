"""Small public types shared by the compiled core and the Python layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ClosedError(RuntimeError):
    """A prefetcher or loader was used after (or during) its ``close()``: a
    loop over a closed one fails loudly, never ends early."""


class GILBoundWarning(UserWarning):
    """A loader's threads took turns inside ``dataset[i]`` (or map's function):
    it holds the GIL, so they did not run it in parallel. Given once per
    loader, where the process may use two CPUs or more; never for threads
    that waited for CPUs, nor where the loader cannot tell (not Linux); how it
    is measured: docs/loader.md, "Where threads lose".

    Attributes
    ----------
    parallelism : float
        How many threads ran it at a time, on average (as
        ``Stats.load_parallelism``, over the windows that showed it).
    wait_share : float
        The share of the threads' time at work (inside it, or woken for it)
        spent waiting for each other.
    threads, cpus : int
        The loader's threads then, and the CPUs the process may use.
    speedup : float or None
        With ``workers="auto"``: the measured speed of the thread count it
        tried over the count it kept; None otherwise.
    """

    parallelism: float = 0.0
    wait_share: float = 0.0
    threads: int = 0
    cpus: int = 0
    speedup: "float | None" = None


@dataclass(frozen=True)
class Stats:
    """A snapshot of a prefetcher's or loader's counters, taken by its
    ``stats()``. The batch counters (``produced`` to
    ``bytes_handed_over``) count the current epoch; the thread counters
    (``samples``, ``load_s``, ``loader_idle_s``, ``bytes_collated``) and the
    pool's count every epoch.

    Attributes
    ----------
    produced, consumed : int
        Batches of the current epoch published ahead / handed to the consumer.
    bytes_copied : int
        Bytes of array data copied into pooled memory.
    consumer_wait_s : float
        Time the consumer spent waiting for a batch (the producer is the bottleneck).
    producer_wait_s : float
        Time the publisher thread spent waiting for room (the consumer is the bottleneck).
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
        Threads at work: a ``Loader``'s or ``map``'s loader threads, a
        ``Prefetcher``'s copy threads.
    samples : int
        Samples a loader's threads have finished, over every epoch.
    load_s : float
        Time spent inside ``dataset[i]`` (or map's function), summed over threads.
    loader_idle_s : float
        Time loader threads waited for room (the consumer is the bottleneck),
        summed over threads.
    bytes_collated : int
        Bytes the default collate copied into batch rows.
    load_parallelism : float
        How many loader threads ran ``dataset[i]`` (or map's function) at a
        time, on average over the time the epochs ran: near the thread count
        where they run in parallel, near 1 where ``dataset[i]`` holds the GIL,
        below the count where the consumer is the bottleneck; 0.0 before the
        first measurement (windows of 50 ms). These three: docs/loader.md,
        "Where threads lose".
    load_wait_share : float
        The share of the threads' time at work spent waiting for each other
        (for the GIL): about 1 - 1/threads for a pure-Python ``dataset[i]``;
        0 where the threads run in parallel.
    tune_reason : str
        With ``workers="auto"``, why the thread count is not growing now:
        ``"growing"``, ``"consumer-bound"``, ``"no gain"``, ``"serialized"``
        (the threads took turns on the GIL), ``"cpus busy"``, ``"thread
        limit"``; ``""`` before the first measurement and with a fixed ``workers``.
    loading : str
        Where a drop-in's epoch loads: ``"threads"``, or ``"processes"`` (its
        framework's worker processes, after its threads measured a GIL-bound
        ``dataset[i]``: the thread counters count what they loaded before);
        ``""`` for the other loaders.
    """

    produced: int = 0
    consumed: int = 0
    bytes_copied: int = 0
    consumer_wait_s: float = 0.0
    producer_wait_s: float = 0.0
    fill: int = 0
    peak_fill: int = 0
    depth: int = 0
    blocks_allocated: int = 0
    blocks_reused: int = 0
    leaves_copied: int = 0
    leaves_handed_over: int = 0
    bytes_handed_over: int = 0
    workers: int = 0
    samples: int = 0
    load_s: float = 0.0
    loader_idle_s: float = 0.0
    bytes_collated: int = 0
    load_parallelism: float = 0.0
    load_wait_share: float = 0.0
    tune_reason: str = ""
    loading: str = ""


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
    dataset : object or None
        An iterable dataset's copy this thread iterates (a stream shards
        itself by ``id`` and ``num_workers``); None for a map-style dataset.
    """

    id: int
    num_workers: int
    seed: int
    epoch: int
    dataset: Any = None


# Shown (type reprs, tracebacks, pickles) under the names users import them by.
for _cls in (ClosedError, GILBoundWarning, Stats, WorkerInfo):
    _cls.__module__ = "prefetch"
del _cls
