"""Errors reach the consumer; nothing hangs (SPEC §4); bad arguments fail at the call (§2)."""
import _thread
import sys
import threading
import traceback

import numpy as np
import pytest

from prefetch import ClosedError, Prefetcher
from support import BlockingSource, never_started_core


class SourceError(Exception):
    pass


def failing_source(n_ok, exc):
    def source_frame_marker():
        raise exc

    for i in range(n_ok):
        yield np.full(2, i)
    source_frame_marker()


@pytest.mark.parametrize("depth", [1, 4])
def test_source_error_raised_after_earlier_batches_as_same_object(depth):
    """§4: the same exception object, after the batches that came before it."""
    exc = SourceError("bad record")
    p = Prefetcher(failing_source(3, exc), depth=depth)
    got = [int(next(p)[0]) for _ in range(3)]
    with pytest.raises(SourceError) as info:
        next(p)
    assert got == [0, 1, 2]
    assert info.value is exc
    p.close()


def test_source_error_carries_note_and_source_frames():
    """§4: PEP 678 note naming the batch; the source's frames in the traceback."""
    p = Prefetcher(failing_source(2, SourceError("x")), depth=2)
    list(zip(range(2), p))
    with pytest.raises(SourceError) as info:
        next(p)
    notes = info.value.__notes__
    assert any("prefetch worker" in n and "fetching batch 3 (counted from 1: the 2 before it are delivered first)" in n for n in notes)
    names = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "source_frame_marker" in names and "failing_source" in names
    p.close()


def test_stream_ends_after_the_error():
    p = Prefetcher(failing_source(0, SourceError()), depth=2)
    with pytest.raises(SourceError):
        next(p)
    with pytest.raises(StopIteration):
        next(p)
    p.close()


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, MemoryError])
def test_base_exceptions_from_the_source_are_delivered(exc_type):
    """§4: any BaseException except StopIteration/GeneratorExit."""
    exc = exc_type()
    with Prefetcher(failing_source(1, exc)) as p:
        next(p)
        with pytest.raises(exc_type) as info:
            next(p)
    assert info.value is exc


def test_exception_that_refuses_notes_is_still_delivered():
    class NoNotes(Exception):
        def add_note(self, note):
            raise TypeError("no notes here")

    exc = NoNotes()
    with Prefetcher(failing_source(0, exc)) as p:
        with pytest.raises(NoNotes) as info:
            next(p)
    assert info.value is exc


def test_copy_error_is_raised_in_consumer():
    """§4: an error while copying (here, an array whose copy fails) is raised the same way."""
    class Unreadable(np.ndarray):
        def __array_finalize__(self, obj):
            if obj is not None and getattr(obj, "_armed", False):
                raise MemoryError("cannot copy this")

    a = np.zeros(3).view(Unreadable)
    a._armed = True
    with Prefetcher([np.zeros(1), a]) as p:
        next(p)
        with pytest.raises(MemoryError) as info:
            next(p)
    assert any("copying batch 2 (counted from 1" in n for n in info.value.__notes__)


def test_timeout_raises_and_stream_continues():
    """§2: TimeoutError says what the worker does; the next next() continues the stream."""
    src = BlockingSource(ready=1, then=[np.full(3, 7)])
    with Prefetcher(src, depth=2, timeout=0.05) as p:
        assert next(p)[0] == 0
        with pytest.raises(TimeoutError, match=r"next\(source\)"):
            next(p)
        src.release.set()
        p._timeout = None   # the remaining wait is unbounded (the test timeout bounds it)
        assert next(p)[0] == 7
        with pytest.raises(StopIteration):
            next(p)


def test_keyboard_interrupt_reaches_blocked_consumer_and_loses_nothing():
    """§4: Ctrl-C (simulated with interrupt_main) stops a consumer blocked in next();
    the prefetcher stays usable and continues the stream."""
    src = BlockingSource(ready=0, then=[np.full(3, 5), np.full(3, 6)])
    with Prefetcher(src, depth=2) as p:
        main = threading.main_thread().ident

        def blocked_next(it):
            # next() inside a frame of its own, so the watcher can see where the
            # main thread is (Prefetcher.__next__ is C: no frame of its own).
            return next(it)

        def interrupt_when_blocked():
            # Ctrl-C must land while the main thread is inside next(): watch its frame.
            frame = sys._current_frames()[main]
            while frame.f_code.co_name != "blocked_next":
                src.entered.wait(0.005)
                frame = sys._current_frames()[main]
            _thread.interrupt_main()

        t = threading.Thread(target=interrupt_when_blocked, daemon=True)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            blocked_next(p)
        t.join()
        src.release.set()
        assert [int(b[0]) for b in p] == [5, 6]


def test_close_from_another_thread_wakes_blocked_consumer():
    """§2/§4: a consumer blocked in next() gets ClosedError when another thread closes."""
    src = BlockingSource()
    p = Prefetcher(src, depth=1)
    closer = threading.Thread(target=lambda: (src.entered.wait(), p.close()))
    closer.start()
    with pytest.raises(ClosedError):
        with pytest.warns(RuntimeWarning, match="daemon"):
            try:
                next(p)
            finally:
                closer.join()
    src.release.set()
    p._core.close()  # idempotent; the worker exits once the source returns


def test_close_returns_when_source_is_stuck_and_warns():
    """§4: close() waits a bounded grace period, then leaves a daemon thread and warns."""
    src = BlockingSource()
    p = Prefetcher(src, depth=1)
    src.entered.wait()
    with pytest.warns(RuntimeWarning, match="still waiting in next"):
        p._core.close(0.1)
    assert p.closed
    src.release.set()   # the stuck worker finishes and exits (checked by the thread-leak fixture)


def test_consumer_gets_error_when_worker_is_dead():
    """§4: a consumer waiting on a worker that is not running gets an error, not a hang."""
    core = never_started_core(iter([1, 2]))
    with pytest.raises(RuntimeError, match="not running"):
        core.take(None)
    core.close()


def test_next_after_close_raises_closed_error():
    """§2: a loop must never end silently early."""
    p = Prefetcher(range(10))
    next(p)
    p.close()
    with pytest.raises(ClosedError):
        next(p)
    assert isinstance(ClosedError(), RuntimeError)


def test_non_iterable_source_fails_in_constructor():
    """§2: iter(source) is called once, in the constructor."""
    with pytest.raises(TypeError, match="source must be iterable, got 42"):
        Prefetcher(42)


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"depth": 0}, ValueError, "depth must be an int >= 1 and <= 1048576, got 0"),
    ({"depth": 2.0}, TypeError, "depth must be an int >= 1, got 2.0"),
    ({"depth": True}, TypeError, "depth .* got True"),
    ({"workers": 0}, ValueError, "workers must be an int >= 1 and <= 1024, got 0"),
    ({"workers": "2"}, TypeError, "workers .* got '2'"),
    ({"timeout": 0}, ValueError, "timeout must be .* got 0"),
    ({"timeout": -1.5}, ValueError, "timeout .* got -1.5"),
    ({"timeout": float("nan")}, ValueError, "timeout .* got nan"),
    ({"timeout": "1"}, TypeError, "timeout .* got '1'"),
    ({"max_bytes": 0}, ValueError, "max_bytes must be an int >= 1 and <= 9223372036854775807, got 0"),
    ({"max_bytes": 1.5}, TypeError, "max_bytes .* got 1.5"),
    ({"name": 3}, TypeError, "name must be a str or None, got 3"),
])
def test_bad_arguments_name_argument_and_value(kwargs, exc, match):
    """§2: TypeError/ValueError at construction naming the argument and the value."""
    with pytest.raises(exc, match=match):
        Prefetcher([1], **kwargs)


def test_close_is_safe_on_half_constructed_object():
    """§2: close() on an object whose constructor failed half-way."""
    p = Prefetcher.__new__(Prefetcher)
    p.close()
    p.close()
    assert p.closed
    with pytest.raises(ValueError):
        Prefetcher(range(3), depth=-1)
