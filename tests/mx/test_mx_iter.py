"""prefetch.mx.PrefetchingIter against mx.io.PrefetchingIter (SPEC §6, §3, §4, §5)."""

import gc
import os
import pathlib
import random
import subprocess
import sys
import threading
import warnings
import weakref

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # mxnet 1.9.1 uses np.bool
    mx = pytest.importorskip("mxnet")

import prefetch  # noqa: E402
import prefetch.mx as pmx  # noqa: E402

MxPrefetchingIter = mx.io.io.PrefetchingIter  # mx's own, whatever patch() does


def mx_iter(*args, **kwargs):
    # mx's constructor calls Thread.setDaemon(), deprecated since Python 3.10.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return MxPrefetchingIter(*args, **kwargs)


def mx_free(it):
    # The only way to stop mx's threads.  Wait for the fetch in flight first: a
    # __del__() during one loses its wake-up and join() hangs (an mx bug).
    for ready in it.data_ready:
        ready.wait()
    it.__del__()


def ndarray_iter(n=10, batch_size=3, handle="pad", shuffle=False, offset=0,
                 label=True):
    x = mx.nd.arange(offset, offset + n * 2).reshape((n, 2))
    y = mx.nd.arange(offset, offset + n) if label else None
    return mx.io.NDArrayIter(x, y, batch_size, shuffle=shuffle, last_batch_handle=handle)


def snap(batch):
    return ([d.asnumpy().tolist() for d in batch.data],
            [lab.asnumpy().tolist() for lab in batch.label or []],
            batch.pad,
            None if batch.index is None else np.asarray(batch.index).tolist())


class RefillIter(mx.io.DataIter):
    """Refills one NDArray in place for every batch, as MXNet's C++ iterators do."""

    def __init__(self, n=5, batch_size=4):
        super().__init__(batch_size)
        self.n, self.k = n, 0
        self.buf = mx.nd.zeros((batch_size, 3))
        self.provide_data = [mx.io.DataDesc("data", (batch_size, 3))]
        self.provide_label = []

    def reset(self):
        self.k = 0

    def next(self):
        if self.k >= self.n:
            raise StopIteration
        self.buf[:] = self.k
        self.k += 1
        return mx.io.DataBatch([self.buf], [], pad=0)


class FailingIter(RefillIter):
    def __init__(self, fail_at, exc):
        super().__init__(n=10)
        self.fail_at, self.exc = fail_at, exc

    def next(self):
        if self.k == self.fail_at:
            raise self.exc
        return super().next()


def test_docstring_example_two_renamed_iters():
    """§6: mx's docstring example, two NDArrayIters renamed, same provide_data."""
    def make():
        return [mx.io.NDArrayIter({"data": mx.nd.ones((100, 10))}, batch_size=25),
                mx.io.NDArrayIter({"data": mx.nd.ones((100, 10))}, batch_size=25)]
    rename = [{"data": "data_1"}, {"data": "data_2"}]
    ref = mx_iter(make(), rename_data=rename)
    try:
        with pmx.PrefetchingIter(make(), rename_data=rename) as ours:
            assert [(d.name, d.shape, d.dtype) for d in ours.provide_data] == \
                [(d.name, d.shape, d.dtype) for d in ref.provide_data] == \
                [("data_1", (25, 10), np.float32), ("data_2", (25, 10), np.float32)]
            assert ours.batch_size == ref.batch_size == 25
            got = [snap(b) for b in ours]
            assert got == [snap(b) for b in ref]
            assert len(got) == 4
    finally:
        mx_free(ref)


def test_is_a_dataiter_with_the_protocol():
    """§6: a subclass of mx.io.DataIter; iteration, provide_label and batches' descs."""
    with pmx.PrefetchingIter(ndarray_iter(), rename_label=[{"softmax_label": "y"}]) as it:
        assert isinstance(it, mx.io.DataIter)
        assert iter(it) is it
        assert [d.name for d in it.provide_label] == ["y"]
        batch = next(it)
        assert isinstance(batch, mx.io.DataBatch)
        assert [d.name for d in batch.provide_label] == ["y"]
        assert [d.name for d in batch.provide_data] == ["data"]


OPS = ["next"] * 6 + ["iter_next"] * 2 + ["getdata", "getlabel", "getpad", "getindex",
                                         "reset"]


def observe(it, op):
    try:
        if op == "next":
            return snap(it.next())
        if op == "iter_next":
            return it.iter_next()
        if op == "reset":
            return it.reset()
        if op == "epoch":
            out = [snap(b) for b in it]
            it.reset()
            return out
        value = getattr(it, op)()
        if op in ("getdata", "getlabel"):
            return [a.asnumpy().tolist() for a in value]
        return value
    except StopIteration:
        return "StopIteration"
    except AttributeError:  # get*() before the first batch, on both classes
        return "AttributeError"


def run_trace(make_sources, ops, seed, ours, depth=1):
    np.random.seed(seed)  # NDArrayIter(shuffle=True) draws from numpy's global RNG
    it = pmx.PrefetchingIter(make_sources(), depth=depth) if ours else mx_iter(make_sources())
    try:
        return [(op, observe(it, op)) for op in ops]
    finally:
        it.close() if ours else mx_free(it)


@pytest.mark.parametrize("handle", ["pad", "discard", "roll_over"])
@pytest.mark.parametrize("n_iters", [1, 2])
def test_same_calls_same_batches_as_mx_depth1(handle, n_iters):
    """§6: depth=1 returns what mx's class returns on random call sequences."""
    shuffle = handle != "roll_over"

    def make():
        return [ndarray_iter(10, 3, handle, shuffle, offset=100 * i) for i in range(n_iters)]
    rng = random.Random(f"{handle}{n_iters}")
    for trial in range(4):
        ops = ["next"] + [rng.choice(OPS) for _ in range(40)]
        ref = run_trace(make, ops, trial, ours=False)
        got = run_trace(make, ops, trial, ours=True)
        assert got == ref, (trial, ops)


@pytest.mark.parametrize("handle", ["pad", "discard", "roll_over"])
@pytest.mark.parametrize("depth", [2, 5])
def test_whole_epochs_same_batches_as_mx_any_depth(handle, depth):
    """§6: with any depth, whole epochs with reset() between them match mx's."""
    def make():
        return [ndarray_iter(11, 4, handle, handle != "roll_over"),
                ndarray_iter(11, 4, handle, False, offset=50)]
    ops = ["epoch"] * 4
    assert run_trace(make, ops, 7, ours=True, depth=depth) == \
        run_trace(make, ops, 7, ours=False)


def test_mid_epoch_reset_loses_and_duplicates_nothing():
    """§6: reset() mid-epoch discards what was prefetched; the next epoch is whole."""
    with pmx.PrefetchingIter(ndarray_iter(12, 3), depth=3) as it:
        first = [snap(it.next())]
        it.reset()
        epoch = [snap(b) for b in it]
        it.reset()
        assert [snap(b) for b in it] == epoch
    assert len(epoch) == 4 and epoch[0] == first[0]


class CountingIter(RefillIter):
    def __init__(self):
        super().__init__(n=20)
        self.pulls, self.pulls_at_reset = 0, []

    def next(self):
        self.pulls += 1
        return super().next()

    def reset(self):
        self.pulls_at_reset.append(self.pulls)
        super().reset()


@pytest.mark.parametrize("depth", [1, 3])
def test_reset_finds_sources_depth_batches_ahead(depth):
    """§6: at reset() the sources were read exactly `depth` past what was taken (mx: 1)."""
    src = CountingIter()
    with pmx.PrefetchingIter(src, depth=depth) as it:
        it.next()
        it.next()
        it.reset()
        assert src.pulls_at_reset == [2 + depth]
        assert it.next().data[0].asnumpy()[0, 0] == 0.0


def test_reset_pulls_what_the_thread_had_not_yet(monkeypatch):
    """§6: even when the fetch thread never got to run, reset() reads ahead as mx's does."""
    # A thread that gets no further than its first round: reset() itself must
    # read the sources up to `taken + depth`.
    first_round = pmx._iter._Rounds.__next__

    def no_further(rounds):
        if rounds.rounds:
            raise StopIteration
        return first_round(rounds)

    monkeypatch.setattr(pmx._iter._Rounds, "__next__", no_further)
    src = CountingIter()
    with pmx.PrefetchingIter(src, depth=2) as it:
        it.next()
        it.reset()
    assert src.pulls_at_reset == [3]


def test_refilled_source_batches_stay_distinct_unlike_mx():
    """§3 rule 3 / §1: a source refilling one NDArray: mx's batches change, ours don't."""
    ref = mx_iter(RefillIter())
    try:
        theirs = list(ref)
        assert [b.data[0].asnumpy()[0, 0] for b in theirs] == [4.0] * 5  # mx aliases
    finally:
        mx_free(ref)
    with pmx.PrefetchingIter(RefillIter(), depth=2) as it:
        ours = list(it)
    assert [b.data[0].asnumpy()[0, 0] for b in ours] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_mutating_the_source_after_next_does_not_change_the_batch():
    """§3 rule 1: the aliasing snippet (mutate the source after next())."""
    src = RefillIter()
    ref = mx_iter(src)
    try:
        batch = ref.next()
        for ready in ref.data_ready:  # let mx's thread finish its own refill first
            ready.wait()
        src.buf[:] = -1
        assert batch.data[0].asnumpy()[0, 0] == -1.0  # mx hands out the source's array
    finally:
        mx_free(ref)
    src = RefillIter()
    with pmx.PrefetchingIter(src, depth=1) as it:
        batch = it.next()
        src.buf[:] = -1
        assert batch.data[0].asnumpy().tolist() == [[0.0] * 3] * 4


def test_exception_in_wrapped_iter_reaches_consumer():
    """§4/§6: a DataIter's error is raised in the consumer after the batches before it."""
    boom = ValueError("boom")
    with pmx.PrefetchingIter(FailingIter(2, boom), depth=3) as it:
        assert it.next().data[0].asnumpy()[0, 0] == 0.0
        assert it.next().data[0].asnumpy()[0, 0] == 1.0
        with pytest.raises(ValueError) as info:
            it.next()
        assert info.value is boom
        assert it.iter_next() is False  # the stream then ends


def test_length_mismatch_raises_assertion_like_mx():
    """§6: iterators of different lengths fail as mx's ("Number of entry mismatches")."""
    for lengths in ((6, 9), (9, 6)):
        srcs = [ndarray_iter(n, 3) for n in lengths]
        with pmx.PrefetchingIter(srcs, depth=2) as it:
            assert it.next().pad == 0 and it.next().pad == 0
            with pytest.raises(AssertionError, match="mismatches"):
                it.next()


def test_object_with_reset_and_next_is_accepted():
    """§6: any object with reset() and next(); no provide_data means none provided."""
    class Plain:
        def __init__(self):
            self.k = 0

        def reset(self):
            self.k = 0

        def next(self):
            if self.k == 3:
                raise StopIteration
            self.k += 1
            return mx.io.DataBatch([mx.nd.full((2, 2), self.k)], None, pad=0)

    with pmx.PrefetchingIter(Plain()) as it:
        assert it.provide_data == [] and it.provide_label == []
        assert [b.data[0].asnumpy()[0, 0] for b in it] == [1.0, 2.0, 3.0]
        it.reset()
        assert len(list(it)) == 3


def test_bad_arguments_fail_at_construction():
    """§2/§6: bad arguments raise TypeError/ValueError naming the argument."""
    with pytest.raises(TypeError, match="iters"):
        pmx.PrefetchingIter([object()])
    with pytest.raises(ValueError, match="iters"):
        pmx.PrefetchingIter([])
    with pytest.raises(ValueError, match="depth"):
        pmx.PrefetchingIter(ndarray_iter(), depth=0)
    with pytest.raises(TypeError, match="depth"):
        pmx.PrefetchingIter(ndarray_iter(), depth="4")
    with pytest.raises(TypeError, match="device"):
        pmx.PrefetchingIter(ndarray_iter(), device="gpu0")


def test_next_after_close_raises_closed_error():
    """§6/§2: next(), iter_next() and reset() after close() raise ClosedError."""
    it = pmx.PrefetchingIter(ndarray_iter())
    it.next()
    it.close()
    it.close()  # idempotent
    assert it.closed
    assert issubclass(pmx.ClosedError, RuntimeError)
    assert pmx.ClosedError is prefetch.ClosedError
    for call in (it.next, it.iter_next, it.reset, lambda: next(it)):
        with pytest.raises(prefetch.ClosedError):
            call()


def test_with_block_closes():
    """§6: `with` closes the iterator."""
    with pmx.PrefetchingIter(ndarray_iter()) as it:
        it.next()
    assert it.closed
    with pytest.raises(prefetch.ClosedError):
        it.next()


def test_dropped_iterator_is_freed_without_gc_and_threads_end():
    """§5: no reference cycle: dropping the last reference frees it and its threads."""
    gc.collect()
    before = threading.active_count()
    it = pmx.PrefetchingIter(ndarray_iter(), depth=2)
    it.next()
    ref = weakref.ref(it)
    gc.disable()
    try:
        del it
        assert ref() is None
    finally:
        gc.enable()
    assert threading.active_count() == before


def test_patch_replaces_and_unpatch_restores():
    """§6 / issue 3: one line makes mx.io.PrefetchingIter ours; unpatch() undoes it."""
    original = mx.io.PrefetchingIter
    cls = pmx.patch()
    try:
        assert mx.io.PrefetchingIter is cls and mx.io.io.PrefetchingIter is cls
        it = mx.io.PrefetchingIter(RefillIter())
        with it:
            assert isinstance(it, pmx.PrefetchingIter)
            assert [b.data[0].asnumpy()[0, 0] for b in it] == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        pmx.unpatch()
    assert mx.io.PrefetchingIter is original and mx.io.io.PrefetchingIter is original
    pmx.unpatch()  # no-op when not patched


def test_exit_without_close_is_clean(tmp_path):
    """§2/§5: a process that exits holding batches and an open iterator exits cleanly."""
    script = tmp_path / "exit_open.py"
    script.write_text(
        "import mxnet as mx, prefetch.mx as pmx\n"
        "x = mx.nd.ones((1000, 100))\n"
        "it = pmx.PrefetchingIter(mx.io.NDArrayIter(x, mx.nd.ones(1000), 10), depth=4)\n"
        "kept = [it.next() for _ in range(3)]\n"
        "print('ok')\n")
    root = str(pathlib.Path(prefetch.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", str(script)],
                          capture_output=True, text=True, timeout=50, cwd=tmp_path, env=env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")


def test_timeout_raises_and_loses_nothing():
    """§2 timeout via §6: TimeoutError while the source is stuck; the stream then goes on."""
    release = threading.Event()

    class Stuck(RefillIter):
        def next(self):
            if self.k == 1:
                assert release.wait(30), "test never released the source"
            return super().next()

    with pmx.PrefetchingIter(Stuck(n=3), depth=1, timeout=0.2) as it:
        assert it.next().data[0].asnumpy()[0, 0] == 0.0
        with pytest.raises(TimeoutError):
            it.next()
        release.set()
        assert [b.data[0].asnumpy()[0, 0] for b in it] == [1.0, 2.0]
