"""NDArray leaves, device= delivery and memory release with MXNet (SPEC §2, §3, §5)."""

import ctypes
import gc
import os
import threading
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # mxnet 1.9.1 uses np.bool
    mx = pytest.importorskip("mxnet")

from mxnet.base import _LIB, check_call  # noqa: E402

import prefetch  # noqa: E402
import prefetch.mx as pmx  # noqa: E402
from prefetch._core import _live_counts  # noqa: E402


def address(nd):
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(nd.handle, ctypes.byref(ptr)))
    return ptr.value


def refill(n, shape=(4, 3), ctx=None, dtype="float32"):
    """Yields the same NDArray n times, refilled in place with the batch number."""
    buf = mx.nd.zeros(shape, ctx=ctx or mx.cpu(), dtype=dtype)
    for k in range(n):
        buf[:] = k
        yield buf


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "uint8", "int32",
                                   "int64", "int8", "bool"])
def test_ndarray_leaf_copied_same_shape_dtype_values(dtype):
    """§3: an NDArray leaf becomes a new NDArray, same shape/dtype/values, own memory."""
    src = mx.nd.array(np.arange(24).reshape(4, 6) % 5, dtype=dtype)
    view = src[1:3]  # a view with an offset into src's memory
    with prefetch.Prefetcher([(src, {"v": view})], depth=1) as p:
        (out, tree), = list(p)
    for got, want in ((out, src), (tree["v"], view)):
        assert type(got) is mx.nd.NDArray
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.context == want.context
        assert (got.asnumpy() == want.asnumpy()).all()
        assert address(got) != address(want)


def test_refilled_ndarray_source_yields_distinct_batches():
    """§3 rule 3: one NDArray refilled in place still gives distinct, kept batches."""
    with prefetch.Prefetcher(refill(8), depth=3) as p:
        got = list(p)
    assert [b.asnumpy()[0, 0] for b in got] == list(range(8))


@pytest.mark.parametrize("shape", [(256, 256), (4, 3)])
def test_engine_orders_copy_before_a_later_write_to_the_source(shape):
    """§3 rule 1: the copy of a large array is an engine op issued without
    waiting; a write to the source issued right after (the source's next
    in-place refill) is ordered after it, and the batch already handed out
    keeps the old values. A small one (issue 23 item 14) is copied at once,
    once the write before it has run: the same values."""
    buf = mx.nd.zeros(shape)

    def source():
        for k in range(6):
            buf[:] = k
            yield buf
            buf[:] = -1  # reaches the engine before the consumer reads the copy

    with prefetch.Prefetcher(source(), depth=4) as p:
        got = list(p)
    assert [(g.asnumpy().min(), g.asnumpy().max()) for g in got] == [(k, k) for k in range(6)]


def test_ndarray_leaves_reuse_pool_blocks_and_count_for_max_bytes():
    """§5: NDArray copies land in the prefetcher's pool: steady state reuses
    blocks, and max_bytes counts them (one 1 MiB batch at a time)."""
    with prefetch.Prefetcher(refill(30, shape=(512, 512)), depth=4, max_bytes=1 << 20) as p:
        for k, b in enumerate(p):
            assert b[0, 0].asscalar() == k  # uses the batch: its copy has run
            del b
        st = p.stats()
    assert st.peak_fill == 1
    assert st.bytes_copied == 30 * (1 << 20)
    assert st.blocks_reused >= 20 and st.blocks_allocated <= 6


def test_device_numpy_leaf_keeps_its_block_until_mxnet_frees_it():
    """§3 rule 2 / §5: a numpy leaf delivered on cpu(0) is an NDArray over its
    pool block (DLPack); the block stays the NDArray's after the prefetcher
    closed and goes back when MXNet frees it."""
    blocks = _live_counts()["blocks"]
    arr = np.arange(12.0).reshape(3, 4)
    with prefetch.Prefetcher([arr] * 3, depth=2, device=mx.cpu(0)) as p:
        got = list(p)
    assert _live_counts()["blocks"] - blocks == 3
    assert all(type(g) is mx.nd.NDArray and (g.asnumpy() == arr).all() for g in got)
    del got
    gc.collect()
    mx.nd.waitall()
    assert _live_counts()["blocks"] == blocks


def test_large_ndarrays_with_two_workers():
    """§2 workers / §3: large NDArray leaves split across workers stay exact copies."""
    with prefetch.Prefetcher(refill(6, shape=(1024, 1024)), depth=2, workers=2) as p:
        got = [b.asnumpy() for b in p]
    assert [(g.min(), g.max()) for g in got] == [(k, k) for k in range(6)]


def test_kept_batch_never_rewritten():
    """§3 rule 2: a batch the user holds keeps its values while many more flow."""
    with prefetch.Prefetcher(refill(40), depth=2) as p:
        first = next(p)
        for _ in p:
            pass
    mx.nd.waitall()
    assert first.asnumpy().tolist() == [[0.0] * 3] * 4


def test_databatch_container_rebuilt():
    """§3: a DataBatch keeps its type, pad, bucket_key and provide_data; arrays copied."""
    data = mx.nd.ones((2, 3))
    desc = [mx.io.DataDesc("data", (2, 3))]
    batch = mx.io.DataBatch([data], [mx.nd.zeros((2,))], pad=1, index=np.array([4, 5]),
                            bucket_key=7, provide_data=desc)
    with prefetch.Prefetcher([batch]) as p:
        out, = list(p)
    assert type(out) is mx.io.DataBatch
    assert (out.pad, out.bucket_key, out.provide_data) == (1, 7, desc)
    assert out.index.tolist() == [4, 5] and out.index is not batch.index
    assert out.data[0] is not data and (out.data[0].asnumpy() == 1).all()
    assert out.label[0].shape == (2,)


def test_sparse_ndarray_leaf_copied():
    """§3: a CSR NDArray leaf becomes a new CSR NDArray with the same values."""
    src = mx.nd.sparse.csr_matrix(np.eye(4, dtype=np.float32))
    with prefetch.Prefetcher([src]) as p:
        out, = list(p)
    assert out.stype == "csr" and out is not src
    assert (out.asnumpy() == np.eye(4)).all()


@pytest.mark.parametrize("ctx", [mx.cpu(1), mx.cpu_pinned(0)], ids=str)
def test_device_delivers_on_context(ctx):
    """§2 device: NDArrays arrive on mx.cpu(1) / mx.cpu_pinned(0), complete."""
    with prefetch.Prefetcher(refill(5), depth=2, device=ctx) as p:
        got = list(p)
    assert all(b.context == ctx for b in got)
    assert [b.asnumpy()[0, 0] for b in got] == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("leaves", ["ndarray", "numpy"])
@pytest.mark.parametrize("front", ["prefetcher", "loader"])
def test_close_synchronises_the_engine_once(front, leaves, monkeypatch):
    """§5 (issue 32): close() synchronises the engine once, whether the
    batches' NDArrays were copied (the leaves' close hook) or numpy leaves
    were delivered to the context (the delivery's close), or both. Before:
    twice with NDArray leaves and device=."""
    from prefetch.mx import _engine
    waits = []
    real = _engine.wait_all
    monkeypatch.setattr(_engine, "wait_all", lambda: (waits.append(1), real())[1])
    full = mx.nd.full if leaves == "ndarray" else np.full
    source = [full((4, 3), k, dtype="float32") for k in range(4)]
    if front == "prefetcher":
        p = prefetch.Prefetcher(iter(source), depth=2, device=mx.cpu(1))
    else:
        p = prefetch.Loader(source, batch_size=None, workers=2, device=mx.cpu(1))
    with p:
        got = list(p)
    assert [float(b.asnumpy()[0, 0]) for b in got] == [0.0, 1.0, 2.0, 3.0]
    assert len(waits) == 1


@pytest.mark.parametrize("ctx", [mx.cpu(1), mx.cpu_pinned(0)], ids=str)
def test_prefetching_iter_device(ctx):
    """§6 device=: PrefetchingIter batches' data and labels are on the context."""
    x = mx.nd.arange(40).reshape((20, 2))
    src = mx.io.NDArrayIter(x, mx.nd.arange(20), 5)
    with pmx.PrefetchingIter(src, depth=2, device=ctx) as it:
        batches = list(it)
    assert len(batches) == 4
    assert all(a.context == ctx for b in batches for a in b.data + b.label)
    assert batches[1].data[0].asnumpy().tolist() == x[5:10].asnumpy().tolist()


def test_ndarray_on_own_non_default_context_stays_there():
    """§3: without device=, a leaf stays on its own context (cpu_pinned here)."""
    with prefetch.Prefetcher(refill(3, ctx=mx.cpu_pinned(0)), depth=1) as p:
        got = list(p)
    assert all(b.context == mx.cpu_pinned(0) for b in got)
    assert [b.asnumpy()[0, 0] for b in got] == [0.0, 1.0, 2.0]


def test_numpy_leaves_become_ndarrays_on_device():
    """§2 device: numpy leaves are delivered as NDArrays on the context, with the
    same values, sharing nothing with the source; a dtype MXNet lacks stays numpy."""
    arr = np.arange(6.0).reshape(2, 3)
    small = np.arange(4, dtype=np.int8)
    odd = np.arange(3, dtype=np.complex64)
    with prefetch.Prefetcher([(arr, small, odd)], device=mx.cpu(1)) as p:
        (a, b, c), = list(p)
    assert isinstance(a, mx.nd.NDArray) and a.context == mx.cpu(1) and a.dtype == np.float64
    assert (a.asnumpy() == arr).all()
    assert isinstance(b, mx.nd.NDArray) and b.dtype == np.int8 and (b.asnumpy() == small).all()
    assert type(c) is np.ndarray and (c == odd).all() and not np.shares_memory(c, odd)
    arr[:] = -1
    assert (a.asnumpy() != -1).all()

def test_bad_device_fails_at_construction():
    """§2: a device that is not an MXNet context, or a GPU that is absent, fails early."""
    with pytest.raises(TypeError, match=r"not the string 'cuda:0': pass .*mx\.gpu\(0\) \(MXNet\)"):
        prefetch.Prefetcher([1], device="cuda:0")
    with pytest.raises(TypeError, match=r"not the string 'gpu:1': pass mx\.gpu\(1\) \(MXNet\)"):
        prefetch.Prefetcher([1], device="gpu:1")
    if mx.context.num_gpus() == 0:
        with pytest.raises(ValueError, match="device"):
            prefetch.Prefetcher([1], device=mx.gpu(0))


class Counted:
    """A DataIter's next() and reset(), counting the batches read; ``read``
    is set once ``wanted`` have been."""

    def __init__(self, it, wanted):
        self.it, self.count, self.wanted = it, 0, wanted
        self.read = threading.Event()
        self.provide_data, self.provide_label = it.provide_data, it.provide_label

    def next(self):
        batch = self.it.next()
        self.count += 1
        if self.count >= self.wanted:
            self.read.set()
        return batch

    def reset(self):
        self.it.reset()


def test_ndarrays_queued_at_close_are_released():
    """§5: close() drops queued NDArrays and syncs the engine: their pool blocks
    are freed before it returns; only the one behind the batch kept stays."""
    gc.collect()
    mx.nd.waitall()   # an earlier test's NDArrays that are still being freed are not counted here
    blocks = _live_counts()["blocks"]
    x = mx.nd.ones((64, 32768))
    source = Counted(mx.io.NDArrayIter(x, mx.nd.ones(64), 4), wanted=5)
    it = pmx.PrefetchingIter(source, depth=4)
    kept = it.next().data[0]
    assert source.read.wait(15)   # the prefetcher has pulled depth batches ahead
    assert _live_counts()["blocks"] - blocks >= 4  # the data of 4 queued batches
    it.close()
    gc.collect()
    assert _live_counts()["blocks"] - blocks == 1  # only the block behind `kept`
    assert (kept.asnumpy() == 1).all()


def rss_bytes():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_create_and_drop_20_iterators_rss_bounded():
    """§5: 20 dropped PrefetchingIters over a large NDArrayIter leave RSS flat."""
    x = mx.nd.ones((2048, 4096))  # 32 MiB; batches of 4 MiB, depth 4
    batch_bytes = 256 * 4096 * 4
    samples = []
    for i in range(20):
        it = pmx.PrefetchingIter(mx.io.NDArrayIter(x, batch_size=256), depth=4)
        for _ in range(3):
            it.next()
        del it  # no close(): dropping it must release everything
        gc.collect()
        mx.nd.waitall()
        samples.append(rss_bytes())
    # A leak of one iterator's buffers each time would add >= 20 * 4 batches.
    assert samples[-1] - samples[2] < 10 * batch_bytes, [s >> 20 for s in samples]


@pytest.mark.parametrize("loader_kw", [dict(num_workers=0),
                                       dict(num_workers=2, thread_pool=True),
                                       dict(num_workers=2)],
                         ids=["inline", "threads", "processes"])
def test_gluon_dataloader_delivered_on_device(loader_kw):
    """Issue 3 / §2 device: a Gluon DataLoader wrapped in Prefetcher, batches on ctx."""
    x = np.arange(64, dtype=np.float32).reshape(32, 2)
    y = np.arange(32, dtype=np.float32)
    dataset = mx.gluon.data.ArrayDataset(x, y)
    loader = mx.gluon.data.DataLoader(dataset, batch_size=8, **loader_kw)
    ctx = mx.cpu_pinned(0)
    with prefetch.Prefetcher(loader, depth=2, device=ctx) as p:
        batches = list(p)
    assert len(batches) == 4
    assert all(a.context == ctx for b in batches for a in b)
    assert np.concatenate([b[0].asnumpy() for b in batches]).tolist() == x.tolist()
    assert np.concatenate([b[1].asnumpy() for b in batches]).tolist() == y.tolist()


def test_numpy_mode_arrays_stay_mx_np():
    """§3 (issue 17): an mx.np.ndarray leaf comes out an mx.np.ndarray (Gluon's
    batches under npx.set_np are), with its values, not the source's memory."""
    with mx.util.np_shape(True), mx.util.np_array(True):
        src = mx.np.arange(6.0).reshape(2, 3)
        with prefetch.Prefetcher([[src]]) as p:
            (out,), = list(p)
        assert type(out) is mx.np.ndarray and out.shape == (2, 3)
        assert out.asnumpy().tolist() == src.asnumpy().tolist()
        src[:] = -1
        assert out.asnumpy()[0, 0] == 0.0
