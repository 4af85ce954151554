"""Stress (SPEC §2-§5), selected with ``-m stress``; seeded by the ``rand`` fixture
(replay a failure with PREFETCH_SEED=<seed>, printed on stderr).

10**5 batches with random producer/consumer delays and sizes; hundreds of
short-lived prefetchers with random source errors, early breaks, drops without
close(), and close() from another thread at a random moment. Afterwards no
thread, batch or buffer outlives its prefetcher (the core's live counters of
cores, pools, blocks and copy threads; weakrefs) and memory is back at its
baseline.

The random delays perturb the interleavings; they never synchronise anything:
every check below holds for any interleaving.
"""
import ctypes
import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest

from prefetch import ClosedError, Prefetcher
from prefetch._core import _live_counts

# Streams here are dropped mid-way on purpose: the unclosed-prefetcher warning
# is expected (tests/core/test_lifecycle.py checks it).
pytestmark = [pytest.mark.stress, pytest.mark.filterwarnings("ignore:unclosed prefetcher:ResourceWarning")]


class Tag:
    """A plain leaf riding in each batch: passed through as the same object, so a
    weakref to it tells whether the prefetcher still holds the batch."""

    __slots__ = ("i", "__weakref__")

    def __init__(self, i):
        self.i = i


class StressError(Exception):
    pass


class StressBaseError(BaseException):
    pass


ERRORS = [StressError, ValueError, MemoryError, KeyboardInterrupt, StressBaseError]


def delay(kind, amount):
    """Perturb the schedule: nothing, yield the GIL, sleep a little, or spin holding the GIL."""
    if kind == 1:
        time.sleep(0)
    elif kind == 2:
        time.sleep(amount * 1e-4)
    elif kind == 3:
        sum(range(int(amount * 3000)))


def draw_size(rand):
    r = rand.random()
    if r < 0.90:
        return rand.randrange(0, 257)
    if r < 0.99:
        return rand.randrange(257, 1 << 16)
    return rand.randrange(1 << 16, 2 << 20)


def draw_delay(rand, p):
    return (rand.choice([1, 2, 3]), rand.random()) if rand.random() < p else (0, 0.0)


def draw_config(rand):
    return dict(depth=rand.randint(1, 16), workers=rand.randint(1, 4),
                max_bytes=rand.choice([None, None, rand.randint(1, 4 << 20)]))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim_malloc():
    """Give malloc's free memory back to the OS (glibc malloc_trim), so RSS counts
    only what is held: after the first large free glibc raises its mmap
    threshold, later 1-16 MiB blocks come from its heap, and their pages stay
    in RSS after free() until trimmed. A no-op without glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def malloc_in_use():
    """Bytes malloc has handed out and not had back (glibc mallinfo2: every arena, plus
    mmapped chunks), or None without it. Unlike RSS this does not count free memory
    that malloc keeps cached in its arenas, so it is exact about what is still held."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


@pytest.mark.timeout(300)
def test_100k_batches_random_sizes_and_delays_in_order(rand):
    """§2/§3: 10**5 batches of random sizes (0 B .. 2 MiB) with random producer and
    consumer delays arrive exactly once, in order, correct; batches kept at random
    stay intact (rule 2); no dropped batch is kept alive by the prefetcher."""
    n = 100_000
    sizes = [draw_size(rand) for _ in range(n)]
    produce_delays = [draw_delay(rand, 0.02) for _ in range(n)]
    consume_delays = [draw_delay(rand, 0.02) for _ in range(n)]
    keep_at = set(rand.sample(range(n), 64))
    config = draw_config(rand)

    def source():
        for i in range(n):
            delay(*produce_delays[i])
            yield (np.full(sizes[i], i % 251, np.uint8), Tag(i))

    kept, dropped = [], []
    with Prefetcher(source(), **config) as p:
        for i, (arr, tag) in enumerate(p):
            assert tag.i == i and arr.size == sizes[i], (config, i)
            assert arr.size == 0 or (arr[0] == arr[-1] == i % 251), (config, i)
            if i in keep_at:
                kept.append((i, arr))
            elif i % 997 == 0:
                dropped.append(weakref.ref(arr))
            delay(*consume_delays[i])
        stats = p.stats()
    assert (stats.produced, stats.consumed) == (n, n), config
    assert stats.peak_fill <= config["depth"]
    for i, arr in kept:
        assert (arr == i % 251).all(), (config, i)
    assert all(r() is None for r in dropped)


def one_run(rand, closer=False):
    """A short prefetcher life with random size, error, early exit and close.
    Returns how the stream ended; asserts it was right and nothing outlived it."""
    live_before = _live_counts()
    n = rand.randrange(0, 200)
    fail_at = rand.randrange(0, n + 1) if rand.random() < 0.3 else None
    exc = rand.choice(ERRORS)("stress") if fail_at is not None else None
    config = draw_config(rand)
    sizes = [draw_size(rand) for _ in range(n)]
    plan = [draw_delay(rand, 0.05) for _ in range(n + 1)]
    stop_at = rand.randrange(0, n + 1) if rand.random() < 0.4 else None
    how_stop = rand.choice(["close", "del", "break-only"])
    tags = []

    def source():
        for i in range(n):
            delay(*plan[i])
            if i == fail_at:
                raise exc
            t = Tag(i)
            tags.append(weakref.ref(t))
            yield (np.full(sizes[i], i % 251, np.uint8), {"tag": t, "i": i})
        delay(*plan[n])
        if fail_at == n:
            raise exc

    p = Prefetcher(source(), **config)
    pref = weakref.ref(p)
    worker = [t for t in threading.enumerate() if t.name == p._core.name]
    got, outcome = [], None
    close_thread = None
    if closer:
        close_at = rand.randrange(0, n + 1)
        reached = threading.Event()
        close_delay = draw_delay(rand, 0.7)

        def close_later(close):
            reached.wait()
            delay(*close_delay)
            close()

        # Thread drops its target's arguments when it ends: no reference to p survives.
        close_thread = threading.Thread(target=close_later, args=(p.close,))
        close_thread.start()
    try:
        while True:
            if closer and len(got) == close_at:
                reached.set()
            if not closer and len(got) == stop_at:
                outcome = "stopped"
                break
            try:
                arr, extra = next(p)
            except StopIteration:
                outcome = "end"
                break
            assert extra["i"] == len(got) and extra["tag"].i == len(got)
            assert arr.size == sizes[len(got)] and (arr == len(got) % 251).all()
            got.append(arr)
            arr = extra = None                         # only `got` holds batches
    except ClosedError:
        outcome = "closed"
    except BaseException as e:
        if e is not exc:
            raise
        outcome = "error"
        assert any("prefetch worker" in note for note in e.__notes__)
        del e
    finally:
        if close_thread is not None:
            reached.set()
            close_thread.join()

    # What came out is a prefix of the stream, and ends the way it must.
    expected_len = n if fail_at is None else fail_at
    if outcome == "end":
        assert len(got) == n and fail_at is None, (config, n, len(got))
    elif outcome == "error":
        assert len(got) == fail_at, (config, fail_at, len(got))
    else:
        assert len(got) <= expected_len
    if not closer and outcome in ("end", "error"):
        with pytest.raises(StopIteration):
            next(p)                                    # the stream has ended for good

    if how_stop == "close" or closer:
        p.close()
        assert p.closed
    del p
    if exc is not None:
        exc.__traceback__ = None                       # its frames hold the source's locals
    if how_stop == "del" and outcome != "error" and not closer:
        assert pref() is None                          # §5: no cycle keeps it alive
    got.clear()
    gc.collect()
    assert pref() is None
    assert not any(w.is_alive() for w in worker)      # the fetch thread is gone
    alive = [t().i for t in tags if t() is not None]
    assert not alive, f"batches kept alive after the prefetcher died: {alive[:10]}"
    assert _live_counts() == live_before               # cores, pools, blocks, copy threads
    return outcome


@pytest.mark.timeout(300)
def test_random_errors_early_breaks_and_drops(rand):
    """§2/§4/§5: hundreds of prefetchers with random source errors (any BaseException),
    early breaks, close() or a plain drop; each stream is a correct prefix, errors
    arrive as the same object, and nothing outlives its prefetcher."""
    outcomes = [one_run(rand) for _ in range(600)]
    assert {"end", "error", "stopped"} <= set(outcomes)


@pytest.mark.timeout(300)
def test_random_close_from_another_thread(rand):
    """§2: close() from another thread at a random moment: the consumer gets a correct
    prefix, then ClosedError (or the end, or the source's error, if those came first)."""
    outcomes = [one_run(rand, closer=True) for _ in range(400)]
    assert "closed" in outcomes


@pytest.mark.timeout(300)
def test_memory_back_to_baseline_after_many_large_prefetchers(rand):
    """§5: many prefetchers of large batches (1..16 MiB, kept and dropped at random,
    closed, broken off, or just dropped): afterwards every buffer is freed (malloc's
    bytes in use are back at the baseline) and RSS is back near its baseline."""
    gc.collect()
    live_before = _live_counts()
    trim_malloc()
    base_rss, base_heap = rss_bytes(), malloc_in_use()
    peak = 0
    for _ in range(60):
        size = rand.randrange(1 << 20, 16 << 20)
        n = rand.randrange(1, 12)
        src = np.full(size, 7, np.uint8)
        p = Prefetcher((src[:rand.randrange(size // 2, size + 1)] for _ in range(n)), **draw_config(rand))
        kept = []
        for arr in p:
            if rand.random() < 0.3:
                kept.append(arr)
            if rand.random() < 0.1:
                break
        peak = max(peak, rss_bytes() - base_rss)
        rand.choice([p.close, lambda: None])()
        del p, kept, arr, src
    gc.collect()
    assert _live_counts() == live_before              # every pool and block freed
    assert peak > 16 << 20, peak                      # the batches were really in memory
    if base_heap is not None:
        held = malloc_in_use() - base_heap
        assert held < 4 << 20, f"{held >> 20} MiB still allocated after every prefetcher died"
    # What malloc still caches after trimming (arenas of threads that are gone,
    # fragmentation) is bounded by a few batches.
    trim_malloc()
    grown = rss_bytes() - base_rss
    assert grown < 160 << 20, f"RSS grew by {grown >> 20} MiB (peak {peak >> 20} MiB)"
