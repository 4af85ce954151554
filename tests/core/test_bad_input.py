"""Bad input fails clearly, at the call, and loses nothing (SPEC §2, §3, §4).

Bad arguments raise TypeError/ValueError naming the argument and the value;
arrays that cannot be copied and batches larger than memory raise in the
consumer, after the batches before them, and the prefetcher closes cleanly.
"""
import importlib.util
import threading

import numpy as np
import pytest

from prefetch import ClosedError, Prefetcher
from support import never_started_core

HAVE_MX = importlib.util.find_spec("mxnet") is not None

# (argument, bad value, exception): every kind of bad value for every argument.
BAD_ARGS = [
    ("depth", 0, ValueError),
    ("depth", -1, ValueError),
    ("depth", 2.0, TypeError),
    ("depth", "4", TypeError),
    ("depth", None, TypeError),
    ("depth", True, TypeError),
    ("depth", np.float64(3), TypeError),
    ("depth", 2**31, ValueError),      # beyond the core's C int
    ("depth", 2**80, ValueError),
    ("workers", 0, ValueError),
    ("workers", -3, ValueError),
    ("workers", 1.0, TypeError),
    ("workers", "2", TypeError),
    ("workers", None, TypeError),
    ("workers", False, TypeError),
    ("workers", 2**31, ValueError),    # beyond the core's C int
    ("timeout", 0, ValueError),
    ("timeout", -1, ValueError),
    ("timeout", float("nan"), ValueError),
    ("timeout", float("inf"), ValueError),
    ("timeout", "1", TypeError),
    ("timeout", True, TypeError),
    ("timeout", 1j, TypeError),
    ("max_bytes", 0, ValueError),
    ("max_bytes", -1, ValueError),
    ("max_bytes", 1.5, TypeError),
    ("max_bytes", "1", TypeError),
    ("max_bytes", True, TypeError),
    ("name", 3, TypeError),
    ("name", b"x", TypeError),
]


@pytest.mark.parametrize("arg,value,exc", BAD_ARGS, ids=[f"{a}={v!r}" for a, v, _ in BAD_ARGS])
def test_bad_argument_raises_naming_argument_and_value(arg, value, exc):
    """§2: TypeError/ValueError at construction, naming the argument and the value given."""
    with pytest.raises(exc) as info:
        Prefetcher([np.zeros(1)], **{arg: value})
    assert arg in str(info.value) and repr(value) in str(info.value), info.value


@pytest.mark.parametrize("value", [2**64 - 1, 2**64, 2**100])
def test_max_bytes_larger_than_any_memory_is_accepted_or_named(value):
    """§2: a huge max_bytes is no cap in practice; it must never surface as a bare
    OverflowError from the C conversion."""
    try:
        p = Prefetcher([np.zeros(3)], max_bytes=value)
    except ValueError as e:
        assert "max_bytes" in str(e) and repr(value) in str(e), e
    else:
        with p:
            assert [b.tolist() for b in p] == [[0.0, 0.0, 0.0]]


def test_bad_argument_does_not_touch_the_source_or_start_threads():
    """§2: nothing is lost: a rejected constructor never calls next(source)."""
    gen = (np.full(2, i) for i in range(3))
    before = threading.active_count()
    with pytest.raises(ValueError):
        Prefetcher(gen, depth=0)
    assert threading.active_count() == before
    assert next(gen)[0] == 0


def test_iter_returning_non_iterator_fails_in_constructor():
    """§2: iter(source) is called once, in the constructor; a bad __iter__ fails there."""
    class BadIterable:
        def __iter__(self):
            return [1, 2]   # a list is not an iterator

    with pytest.raises(TypeError, match="source must be iterable"):
        Prefetcher(BadIterable())


def test_error_raised_by_source_iter_propagates_as_is():
    """§2: an error inside the source's __iter__ is the source's own error, at construction."""
    class Broken:
        def __iter__(self):
            raise ValueError("cannot open the dataset")

    with pytest.raises(ValueError, match="cannot open the dataset"):
        Prefetcher(Broken())


def test_positional_keyword_only_arguments_are_rejected():
    """§2: workers, device, timeout, max_bytes and name are keyword-only."""
    with pytest.raises(TypeError):
        Prefetcher([1], 2, 2)


def test_unknown_keyword_is_rejected():
    with pytest.raises(TypeError, match="bogus"):
        Prefetcher([1], bogus=1)


def test_numpy_integer_arguments_are_accepted():
    """§2: depth/workers/max_bytes accept any integral number (numpy ints included)."""
    with Prefetcher([np.arange(3)], depth=np.int64(2), workers=np.int32(2), max_bytes=np.uint64(64)) as p:
        assert [b.tolist() for b in p] == [[0, 1, 2]]


@pytest.mark.parametrize("timeout", [1e10, 1e300, 2**70])
def test_huge_timeout_is_not_an_immediate_timeout(timeout):
    """§2: a valid but huge timeout (centuries, past int64 nanoseconds) means "wait";
    it must never overflow into a deadline in the past. Deterministic probe: a core
    whose worker never started answers a waiting take() with "not running" (§4), and
    with TimeoutError only once the deadline has passed, which it cannot have."""
    core = never_started_core(iter([np.zeros(1)]))
    try:
        with pytest.raises(RuntimeError, match="not running"):
            core.take(timeout)
    finally:
        core.close()
        del core            # a failure's traceback must not keep the core alive


@pytest.mark.skipif(HAVE_MX, reason="the core-only environment: no MXNet installed")
def test_device_of_a_framework_not_installed_says_what_to_install():
    """§2/§6: a device= of a framework whose adapter cannot import fails at the
    constructor, naming the framework, the type and the install line."""
    context = type("Context", (), {"__module__": "mxnet.context"})
    gen = (np.full(2, i) for i in range(3))
    with pytest.raises(ImportError) as info:
        Prefetcher(gen, device=context())
    assert "mxnet" in str(info.value) and "Context" in str(info.value)
    assert "pip install" in str(info.value)
    assert next(gen)[0] == 0


@pytest.mark.parametrize("device", ["gpu", "gpu(0)", 42])
def test_device_string_or_number_fails_at_construction_naming_it(device):
    """§2: device='gpu' is no device object: TypeError at the call, naming the value."""
    with pytest.raises(TypeError, match="device must be") as info:
        Prefetcher([np.zeros(1)], device=device)
    assert repr(device) in str(info.value)


@pytest.mark.parametrize("device", ["cuda", "gpu:1", "cpu", "tpu"])
def test_device_string_says_a_device_object_is_needed(device):
    """Issue 19: a device named by a string is refused (it does not say which framework's
    arrays to make); the error names the value and says to pass a device object (the
    framework's own wording is checked in tests/pytorch and tests/mx)."""
    with pytest.raises(TypeError) as info:
        Prefetcher([np.zeros(1)], device=device)
    assert f"device must be a framework's device object, not the string {device!r}: pass " in str(info.value)


@pytest.mark.skipif(not HAVE_MX, reason="needs MXNet for device=")
@pytest.mark.parametrize("device", [42, "not-a-context"])
def test_bad_device_names_argument_and_value(device):
    """§2: a device that is not an MXNet context fails at construction, naming it."""
    with pytest.raises((TypeError, ValueError)) as info:
        Prefetcher([np.zeros(1)], device=device)
    assert "device" in str(info.value) and repr(device) in str(info.value), info.value


# ---------------------------------------------------------------------------
# Arrays that cannot be copied.

class RefusesCopy(np.ndarray):
    """An array subclass that refuses to be copied: every new view/copy raises."""

    def __array_finalize__(self, obj):
        if obj is not None and getattr(obj, "armed", False):
            raise TypeError("RefusesCopy: this array cannot be copied")


def refusing(shape=(4,)):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape).view(RefusesCopy)
    a.armed = True
    return a


@pytest.mark.parametrize("workers", [1, 2])
def test_array_refusing_copy_raises_in_consumer_after_earlier_batches(workers):
    """§4: the copy error is raised in the consumer, after the batches before it,
    as the same error type, with a note naming the batch; the stream then ends."""
    src = [np.zeros(2), {"x": np.ones(2)}, (np.zeros(1), [refusing()]), np.ones(3)]
    with Prefetcher(src, depth=3, workers=workers) as p:
        first = next(p)
        second = next(p)
        with pytest.raises(TypeError, match="cannot be copied") as info:
            next(p)
        with pytest.raises(StopIteration):
            next(p)
    assert first.tolist() == [0.0, 0.0] and second["x"].tolist() == [1.0, 1.0]
    assert any("copying batch 3 (counted from 1" in n for n in info.value.__notes__)


def test_refused_copy_leaves_a_closable_prefetcher():
    """§2: after a copy error, close() is clean and next() says the prefetcher is closed."""
    p = Prefetcher([refusing((2, 3))])
    with pytest.raises(TypeError):
        next(p)
    p.close()
    assert p.closed
    with pytest.raises(ClosedError):
        next(p)


@pytest.mark.parametrize("leaf", [bytearray(b"abc"), memoryview(b"xyz"), b"raw"],
                         ids=["bytearray", "memoryview", "bytes"])
def test_buffer_objects_that_are_not_arrays_pass_through(leaf):
    """§3: a leaf the prefetcher does not know how to copy passes through as the same object."""
    with Prefetcher([(leaf, np.zeros(1))]) as p:
        out, _ = next(p)
    assert out is leaf


# ---------------------------------------------------------------------------
# Batches larger than memory: 2**50 bytes (a PiB, beyond the 47-bit address
# space) as 0-stride views of one byte, so the source side touches no memory.

def huge_view(dtype=np.uint8, n=2**50):
    tiny = np.zeros(1, dtype)
    return np.lib.stride_tricks.as_strided(tiny, shape=(n // tiny.itemsize,), strides=(0,))


@pytest.mark.parametrize("workers", [1, 2])
def test_batch_larger_than_memory_raises_memory_error_in_consumer(workers):
    """§4: out of memory while copying is raised in the consumer (MemoryError), after
    the batches before it; the process lives on."""
    src = [np.full(3, 1), (np.full(3, 2), huge_view()), np.full(3, 3)]
    with Prefetcher(src, depth=2, workers=workers) as p:
        assert next(p).tolist() == [1, 1, 1]
        with pytest.raises(MemoryError) as info:
            next(p)
        with pytest.raises(StopIteration):
            next(p)
    assert any("copying batch 2 (counted from 1" in n for n in info.value.__notes__)


def test_broadcast_batch_larger_than_memory_raises_memory_error():
    """§4: a 0-stride broadcast view of a PiB (2-D, float64) fails the same way."""
    view = np.broadcast_to(np.float64(7.0), (2**25, 2**22))
    assert view.nbytes == 2**50
    with Prefetcher([view]) as p:
        with pytest.raises(MemoryError):
            next(p)


def test_subclass_batch_larger_than_memory_raises_memory_error():
    """§4: the subclass path (numpy allocates the copy) fails with MemoryError too."""
    class Tagged(np.ndarray):
        pass

    with Prefetcher([huge_view().view(Tagged)]) as p:
        with pytest.raises(MemoryError):
            next(p)


def test_prefetcher_closes_cleanly_after_memory_error_and_frees_what_it_held():
    """§2/§5: after the MemoryError, close() returns, the worker is gone, and a new
    prefetcher in the same process works (nothing is left locked or leaked)."""
    p = Prefetcher([np.zeros(10), huge_view(), np.zeros(10)], depth=3, workers=2)
    next(p)
    with pytest.raises(MemoryError):
        next(p)
    p.close()
    assert p.closed and p.stats().fill == 0
    with Prefetcher([np.arange(5)] * 3, workers=2) as q:
        assert [b.tolist() for b in q] == [[0, 1, 2, 3, 4]] * 3


def test_memory_error_for_one_batch_does_not_need_max_bytes_room():
    """§2: a batch bigger than max_bytes is still attempted alone; failing to allocate
    it is a MemoryError in the consumer, not a producer waiting forever for room."""
    with Prefetcher([np.zeros(4), huge_view()], depth=4, max_bytes=1024) as p:
        next(p)
        with pytest.raises(MemoryError):
            next(p)


class _MapStyle:
    """A map-style dataset: __getitem__ and __len__, no __iter__; its
    __getitem__ never raises IndexError, so the old sequence protocol would
    iterate it for ever."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return np.full(2, i)


@pytest.mark.timeout(10)
def test_a_map_style_dataset_as_source_is_refused_naming_the_loader():
    """Issue 35 item 5 (§2: a source that cannot be iterated fails at the
    call): Prefetcher(dataset) on a map-style dataset iterated its samples one
    by one through __getitem__(0, 1, ...), here for ever. Now a TypeError at
    the call names prefetch.Loader, and iter(dataset) is the way to ask for
    the items one by one."""
    with pytest.raises(TypeError, match=r"_MapStyle.*no __iter__.*prefetch\.Loader\(source, batch_size="):
        Prefetcher(_MapStyle())

    class Bounded(_MapStyle):
        def __getitem__(self, i):
            if i >= len(self):
                raise IndexError(i)
            return np.full(2, i)

    with Prefetcher(iter(Bounded())) as p:
        assert [int(a[0]) for a in p] == [0, 1, 2]
