"""MXNet adapter: NDArray leaves, DataBatch containers, ``device=`` delivery and
``PrefetchingIter``, a drop-in for ``mx.io.PrefetchingIter`` (SPEC §2, §3, §5, §6).

Threading contract: ``_copy_ndarray``, ``_rebuild_batch`` and the callable made by
``_device_finisher`` run on a prefetcher's fetch thread with the GIL held; so does
``_Feed.__next__`` (it is the source of ``PrefetchingIter``'s prefetcher).  Every
``PrefetchingIter`` method runs on the consumer's thread.  ``import prefetch`` never
imports this module: the core imports it the first time it meets an mxnet type or
a ``device=``, and importing it registers the hooks.
"""

import copy
import ctypes
import threading
import warnings
import weakref

import numpy as np

try:
    with warnings.catch_warnings():
        # mxnet 1.9.1 touches np.bool at import: a DeprecationWarning on numpy 1.23.
        warnings.simplefilter("ignore", DeprecationWarning)
        import mxnet as mx
        from mxnet.base import _LIB, NDArrayHandle, check_call
        from mxnet.ndarray import ndarray as _nd
except (ImportError, OSError, AttributeError) as _exc:
    # AttributeError: mxnet 1.9.1 uses aliases that numpy 1.24 removed (np.bool).
    raise ImportError(
        "prefetch.mx needs MXNet: pip install 'prefetch-ring[mxnet]' "
        "(mxnet==1.9.1 with numpy<1.24, Python <= 3.11); importing mxnet failed: "
        f"{_exc!r}") from _exc

from .. import ClosedError, Prefetcher, _ring
from . import _engine

__all__ = ["PrefetchingIter", "patch", "unpatch", "ClosedError"]


# --------------------------------------------------------------------------
# Core hooks (SPEC §3): NDArray leaves and DataBatch containers.

# numpy dtype -> DLPack (code, bits, lanes), as mx.nd.from_numpy maps them
# (DLDataType.TYPE_MAP, checked on 1.9.1: bool, uint8, int32, int64, float16/32/64).
# int8, uint32, ... take the engine-copy path.
_DL_DTYPES = {np.dtype(name): _nd.DLDataType(*code)
              for name, code in _nd.DLDataType.TYPE_MAP.items()
              if name not in ("uint32", "uint64")}  # MXNet rejects these two
_DL_CPU0 = _nd.DLContext(1, 0)  # kDLCPU, device 0
# numpy dtypes an NDArray can hold (device= delivers these leaves as NDArrays).
_MX_DTYPES = frozenset(np.dtype(t) for t in
                       ("float16", "float32", "float64", "uint8", "int8", "int32", "int64", "bool"))
_ZERO_COPY_TYPES = frozenset(dt.type for dt in _DL_DTYPES)
_SHAPE_TYPES = {}  # ndim -> ctypes.c_int64 * ndim
_py_incref = ctypes.pythonapi.Py_IncRef
_py_incref.argtypes = [ctypes.py_object]
_py_incref.restype = None


def _wrap_block(block):
    """An NDArray on cpu(0) over ``block``'s memory that keeps ``block`` alive.

    What ``mx.nd.from_numpy(block, zero_copy=True)`` does, at half its cost, and
    without flagging ``block`` read-only: a DLManagedTensor whose manager_ctx holds
    a reference to ``block``, released by mx's deleter when the engine frees the
    NDArray's storage.  ``transient_handle=True``: MXNet copies the struct, so
    ours may go when this returns (shape is read during the call).
    """
    managed = _nd.DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = block.__array_interface__["data"][0]
    tensor.ctx = _DL_CPU0  # structure fields are assigned by copy
    tensor.ndim = ndim = block.ndim
    tensor.dtype = _DL_DTYPES[block.dtype]
    shape_type = _SHAPE_TYPES.get(ndim)
    if shape_type is None:
        shape_type = _SHAPE_TYPES[ndim] = ctypes.c_int64 * ndim
    shape = shape_type(*block.shape)
    tensor.shape = shape  # decays to a pointer; read before MXNDArrayFromDLPackEx returns
    managed.manager_ctx = id(block)
    managed.deleter = _nd.dl_managed_tensor_deleter
    _py_incref(block)  # owned by the NDArray from here; the deleter drops it
    handle = NDArrayHandle()
    try:
        check_call(_LIB.MXNDArrayFromDLPackEx(
            ctypes.byref(managed), True, ctypes.byref(handle)))
    except BaseException:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(block))
        raise
    return mx.nd.NDArray(handle=handle)


class _HostView:
    """Exposes a CPU NDArray's memory to numpy, keeping the NDArray alive."""

    __slots__ = ("__array_interface__", "_nd")

    def __init__(self, nd, ptr, shape, dtype):
        self._nd = nd
        self.__array_interface__ = {
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "data": (ptr, True),  # read-only: we never write a source's memory
            "version": 3,
        }


def _host_view(nd, shape, dtype):
    """A read-only numpy view of a default-storage CPU NDArray, no copy.

    wait_to_read() first: the engine may still be writing it.  MXNDArrayGetData
    also reorders an MKLDNN-layout array to the default layout (and waits).
    """
    nd.wait_to_read()
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(nd.handle, ctypes.byref(ptr)))
    return np.asarray(_HostView(nd, ptr.value, shape, dtype))


def _copy_ndarray(nd, copy_array):
    """Leaf hook: a fresh NDArray with ``nd``'s shape, dtype and values.

    The copy is one engine op issued from C (``_engine.copy_leaf``): the engine
    orders it after the op that writes ``nd`` and before every use of the
    result, so the fetch thread never waits for it.  Sparse, 0-d and empty
    arrays take MXNet's own copy, equally unwaited.
    """
    # The core's plan today is its bound copy_array; its __self__ is the core.
    out = _engine.copy_leaf(nd, copy_array.__self__)
    if out is None:
        ctx = nd.context
        if ctx.device_typeid == 5:  # cpu_shared: land the copy on cpu(0)
            ctx = mx.cpu(0)
        out = nd.copy() if nd.stype != "default" else nd.copyto(ctx)
    return out


def _rebuild_batch(batch, recurse):
    """Container hook for mx.io.DataBatch (and subclasses): copies data, label
    and index; pad, bucket_key and provide_data/provide_label pass through."""
    new = copy.copy(batch)
    new.data = recurse(batch.data)
    new.label = recurse(batch.label)
    new.index = recurse(batch.index)
    return new


def _as_context(device):
    if not isinstance(device, mx.Context):
        raise TypeError(
            "device must be an MXNet context such as mx.gpu(0), mx.cpu_pinned(0) "
            f"or mx.cpu(1), got {device!r}")
    if device.device_type == "gpu" and device.device_id >= mx.context.num_gpus():
        raise ValueError(
            f"device={device!r}: this MXNet sees {mx.context.num_gpus()} GPU(s)")
    return device


def _device_finisher(device):
    """Core hook for ``Prefetcher(device=...)``: returns ``finish(batch)``, run on
    the fetch thread after the host copies are complete.  It delivers every array
    leaf as an NDArray on ``device`` (SPEC §2: numpy leaves too, when MXNet has
    their dtype; object, string, complex and structured arrays stay numpy) and
    returns only when the engine has finished the copies, so a batch handed out
    is complete on its context."""
    ctx = _as_context(device)

    def finish(batch):

        def move(leaf):
            if type(leaf) is np.ndarray and leaf.dtype in _MX_DTYPES:
                # A fresh pool-backed copy: wrap its block without a copy when
                # DLPack can carry it, then move it like any host NDArray.
                if leaf.dtype in _DL_DTYPES and leaf.size:
                    leaf = _wrap_block(leaf)
                else:
                    leaf = mx.nd.array(leaf, ctx=mx.cpu(0), dtype=leaf.dtype)
                if ctx == mx.cpu(0):
                    return leaf
            if isinstance(leaf, mx.nd.NDArray) and leaf.context != ctx:
                moved = _engine.copy_leaf(leaf, None, ctx)
                leaf = leaf.copyto(ctx) if moved is None else moved
            return leaf

        # No wait: the engine orders every use of the batch after its copies.
        return _ring.map_leaves(move, batch)

    # For the core's close(), after it dropped the queued batches: SPEC §5 wants
    # the engine synchronised (device memory returned) before close() returns.
    finish.close = _engine_sync
    return finish


def _engine_sync():
    """Wait until the engine has run every pending op, frees included (a dropped
    NDArray's memory is freed by an engine op, and a pool block behind one is
    released only then).  Never call it from an engine callback or a finalizer."""
    _engine.wait_all()


_ring.register_leaf(mx.nd.NDArray, _copy_ndarray)
_ring.register_container(mx.io.DataBatch, _rebuild_batch)


# --------------------------------------------------------------------------
# PrefetchingIter (SPEC §6)

_MISMATCH = "Number of entry mismatches between iterators"


class _Feed:
    """The source of a PrefetchingIter's Prefetcher: one round pulls one batch
    from each wrapped iterator and combines them (as mx's iter_next does).

    A round may start only while ``rounds < taken + depth``, so at any quiet
    moment the wrapped iterators have been read exactly ``depth`` batches past
    what the consumer took (or to their end), as mx's class with depth 1.  That
    makes ``reset()`` deterministic.  It holds no reference to the
    PrefetchingIter: the fetch thread must not keep it alive (SPEC §5).
    """

    def __init__(self, iters, depth):
        self.iters = iters
        self.depth = depth
        self.cond = threading.Condition()
        self.rounds = 0       # rounds completed
        self.taken = 0        # batches the consumer took
        self.in_round = False
        self.stopped = False  # set by reset()/close(): no round starts after it
        self.done = False     # the iterators ended (or raised): no more rounds
        # The previous round's source arrays. The next round starts once the
        # engine has copied them: the fetch thread runs at most one batch ahead
        # of the engine, so a source that allocates every batch (NDArrayIter's
        # slices) has no backlog of arrays alive (each fresh one page-faults).
        self.last = []

    def __iter__(self):
        return self

    def __next__(self):
        with self.cond:
            while not self.stopped and self.rounds >= self.taken + self.depth:
                self.cond.wait()
            if self.stopped or self.done:
                raise StopIteration
            self.in_round = True
        try:
            last, self.last = self.last, []
            _engine.wait_unused(last)
            last = None
            batch = self.round()
        finally:
            with self.cond:
                self.in_round = False
                self.cond.notify_all()
        if batch is None:
            raise StopIteration
        self.last = [x for x in batch.data + batch.label if isinstance(x, mx.nd.NDArray)]
        return batch

    def round(self):
        """Pull one batch from every iterator; None at the end of the data."""
        ok = False
        try:
            batches = []
            for it in self.iters:
                try:
                    batches.append(it.next())
                except StopIteration:
                    batches.append(None)
            ok = True
        finally:
            self.rounds += 1
            if not ok:
                self.done = True
        first = batches[0]
        if first is None:
            self.done = True
            if any(b is not None for b in batches):
                raise AssertionError(_MISMATCH)
            return None
        for b in batches:
            if b is None or b.pad != first.pad:
                self.done = True
                raise AssertionError(_MISMATCH)
        return mx.io.DataBatch(
            sum([list(b.data) for b in batches], []),
            sum([[] if b.label is None else list(b.label) for b in batches], []),
            first.pad, first.index)

    def took_one(self):
        with self.cond:
            self.taken += 1
            self.cond.notify_all()

    def stop(self, wait=False):
        """No round starts after this; with ``wait``, also waits for the round
        in progress (reset() needs the iterators quiet; close() must not wait
        on a stuck source, the prefetcher's close() bounds that)."""
        with self.cond:
            self.stopped = True
            self.last = []
            self.cond.notify_all()
            try:
                while wait and self.in_round:
                    self.cond.wait(0.1)
            except BaseException:
                # KeyboardInterrupt in reset(): nothing was dropped, carry on.
                self.stopped = False
                self.cond.notify_all()
                raise

    def top_up(self):
        """After stop() and the prefetcher's close(): read the iterators to where
        an undisturbed prefetcher would be (``depth`` past the consumer), so a
        reset finds them where mx's class leaves them."""
        while not self.done and self.rounds < self.taken + self.depth:
            self.round()


def _shutdown(feed, pf):
    feed.stop()  # first: the fetch thread may be parked in the feed's wait
    pf.close()


def _descs(iters, renames, attr):
    if renames is None:
        return sum([list(getattr(i, attr, None) or []) for i in iters], [])
    return sum([[
        mx.io.DataDesc(r[x.name], x.shape, x.dtype)
        if isinstance(x, mx.io.DataDesc) else mx.io.DataDesc(*x)
        for x in (getattr(i, attr, None) or [])
    ] for r, i in zip(renames, iters)], [])


class PrefetchingIter(mx.io.DataIter):
    """Prefetches batches of one or several DataIters on a background thread,
    each batch a fresh copy (drop-in for ``mx.io.PrefetchingIter``).

    Parameters
    ----------
    iters : DataIter or list of DataIter
        Iterators combined batch by batch (data and labels concatenated, pad
        and index from the first).  Any object with ``reset()`` and ``next()``.
    rename_data, rename_label : None or list of dict
        The i-th dict renames entries of ``iters[i].provide_data`` (``_label``).
    depth : int
        Batches prefetched ahead.  With ``depth=1`` every sequence of calls
        returns what ``mx.io.PrefetchingIter`` returns.
    device : mx.Context or None
        Deliver the NDArrays on this context (e.g. ``mx.gpu(0)``), the copy done
        in the background.
    timeout, max_bytes, workers, name
        As for ``prefetch.Prefetcher``.

    Raises
    ------
    prefetch.ClosedError
        From ``next()``, ``iter_next()`` or ``reset()`` after ``close()``.
    AssertionError
        When the iterators disagree on length or pad (as mx's class).

    Examples
    --------
    >>> it1 = mx.io.NDArrayIter({'data': mx.nd.ones((100, 10))}, batch_size=25)
    >>> it2 = mx.io.NDArrayIter({'data': mx.nd.ones((100, 10))}, batch_size=25)
    >>> with PrefetchingIter([it1, it2], rename_data=[{'data': 'data_1'},
    ...                                               {'data': 'data_2'}]) as it:
    ...     [d.name for d in it.provide_data]
    ['data_1', 'data_2']
    """

    def __init__(self, iters, rename_data=None, rename_label=None, depth=4,
                 device=None, *, timeout=None, max_bytes=None, workers=1, name=None):
        super().__init__()
        self._closed = True  # until a prefetcher runs: close() must work half-built
        if not isinstance(iters, list):
            iters = [iters]
        if not iters:
            raise ValueError("iters must hold at least one iterator, got []")
        for it in iters:
            if not (callable(getattr(it, "next", None))
                    and callable(getattr(it, "reset", None))):
                raise TypeError(
                    f"iters: each must have next() and reset() (a DataIter), got {it!r}")
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"depth must be an int >= 1, got {depth!r} ({type(depth).__name__})")
        if depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        if device is not None:
            _as_context(device)
        self.n_iter = len(iters)
        self.iters = iters
        self.rename_data = rename_data
        self.rename_label = rename_label
        descs = self.provide_data
        self.batch_size = descs[0][1][0] if descs else getattr(iters[0], "batch_size", 0)
        self.current_batch = None
        self._depth = depth
        self._options = dict(depth=depth, device=device, timeout=timeout,
                             max_bytes=max_bytes, workers=workers, name=name)
        self._start()
        self._closed = False

    def _start(self):
        feed = _Feed(self.iters, self._depth)
        try:
            pf = Prefetcher(feed, **self._options)
        except BaseException:
            feed.stop()
            raise
        self._feed, self._pf = feed, pf
        self._exhausted = False
        self._finalizer = weakref.finalize(self, _shutdown, feed, pf)

    @property
    def provide_data(self):
        return _descs(self.iters, self.rename_data, "provide_data")

    @property
    def provide_label(self):
        return _descs(self.iters, self.rename_label, "provide_label")

    @property
    def closed(self):
        return self._closed

    def _check_open(self):
        if self._closed:
            raise ClosedError(f"{type(self).__name__} is closed")

    def reset(self):
        """Drop what was prefetched, reset every iterator, and start prefetching."""
        self._check_open()
        feed, pf = self._feed, self._pf
        feed.stop(wait=True)
        self._finalizer.detach()
        pf.close()
        try:
            feed.top_up()  # a source error here is raised, after the reset below
        finally:
            for it in self.iters:
                it.reset()
            self._start()

    def iter_next(self):
        self._check_open()
        if self._exhausted:
            return False
        try:
            batch = next(self._pf)
        except StopIteration:
            self._exhausted = True
            return False
        self._feed.took_one()
        batch.provide_data = self.provide_data
        batch.provide_label = self.provide_label
        self.current_batch = batch
        return True

    def next(self):
        if self.iter_next():
            return self.current_batch
        raise StopIteration

    def getdata(self):
        self._check_open()
        return self.current_batch.data

    def getlabel(self):
        self._check_open()
        return self.current_batch.label

    def getindex(self):
        self._check_open()
        return self.current_batch.index

    def getpad(self):
        self._check_open()
        return self.current_batch.pad

    def stats(self):
        """``prefetch.Stats`` of the current epoch's prefetcher."""
        return self._pf.stats()

    def close(self):
        """Stop prefetching, drop what was prefetched, and wait for the engine to
        free it (SPEC §5); idempotent.  Batches the caller holds stay valid."""
        if self._closed:
            return
        self._closed = True
        self.current_batch = None
        self._finalizer()
        _engine_sync()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        # Scripts free mx's class with an explicit __del__(); keep that working.
        # No engine sync here: the GC may run this on an engine callback thread.
        if not getattr(self, "_closed", True):
            self._closed = True
            self.current_batch = None
            self._finalizer()

    def __repr__(self):
        state = "closed" if self._closed else "open"
        return (f"<prefetch.mx.PrefetchingIter n_iter={self.n_iter} "
                f"depth={self._depth} {state}>")


# --------------------------------------------------------------------------
# patch(): for scripts that cannot be edited.

_saved = None


def patch(depth=1, **options):
    """Make ``mx.io.PrefetchingIter`` (and ``mxnet.io.io.PrefetchingIter``) ours
    for code that looks it up after this call; ``unpatch()`` restores mx's.

    ``depth`` defaults to 1, so every sequence of calls returns what mx's class
    returned; ``options`` (device, timeout, ...) apply to every instance.
    Code that did ``from mxnet.io import PrefetchingIter`` earlier keeps mx's.
    """
    global _saved
    defaults = dict(options, depth=depth)

    class Patched(PrefetchingIter):
        def __init__(self, iters, rename_data=None, rename_label=None, **kw):
            super().__init__(iters, rename_data, rename_label, **{**defaults, **kw})

    Patched.__name__ = Patched.__qualname__ = "PrefetchingIter"
    Patched.__module__ = __name__
    if _saved is None:
        _saved = mx.io.PrefetchingIter
    mx.io.PrefetchingIter = Patched
    mx.io.io.PrefetchingIter = Patched
    return Patched


def unpatch():
    """Restore ``mx.io.PrefetchingIter``; a no-op when not patched."""
    global _saved
    if _saved is not None:
        mx.io.PrefetchingIter = _saved
        mx.io.io.PrefetchingIter = _saved
        _saved = None
