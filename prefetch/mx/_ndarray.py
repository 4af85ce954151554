"""NDArray leaves and DataBatch containers, registered on import.

Threading contract: ``_copy_ndarray`` and the DataBatch hooks run on the
thread that copies the batch (a Prefetcher's publisher thread, a Loader's
threads) with the GIL held; ``engine_sync`` runs in close().
"""
import copy
import ctypes
import threading
import weakref

from prefetch._framework import register_container, register_leaf
from prefetch.mx import _engine
from prefetch.mx._mxnet import _LIB, check_call, mx

# CopyPlan (one per prefetcher or loader thread) -> [its batch number, the copies made in that
# batch]. See _throttle.
_previous = weakref.WeakKeyDictionary()


def _throttle(plan):
    """At a batch's first engine copy, once issued: wait until the engine has
    run the previous batch's copies. The copying thread then runs at most
    about one batch ahead of the engine, so a source that allocates every
    batch (an NDArrayIter's slices, a DataLoader's stacked batch) keeps no
    backlog of large arrays alive, each a fresh allocation that page-faults
    (measured with a Gluon DataLoader of 10 MB batches: up to 2x the time per
    batch without). It holds the copies, never the sources: the core drops a
    source's batch before the next next(source), for sources that refill one
    buffer. Returns the list this batch's copies go into."""
    state = _previous.get(plan)
    if state is None:
        state = _previous[plan] = [plan.batches, []]
    elif state[0] != plan.batches:
        last, state[1] = state[1], []
        state[0] = plan.batches
        _engine.wait_written(last)
    return state[1]


def _copy_ndarray(nd, plan):
    """Leaf hook: a fresh NDArray with ``nd``'s shape, dtype, values and type
    (``mx.np.ndarray`` or NDArray), where docs/mxnet.md says: made in C
    (``_engine.copy_leaf``: at once for a small host array, else by one
    engine op that orders it before every use of the result, so it is not
    waited for; only the previous batch's copies are, once per batch,
    _throttle). Sparse, 0-d and empty arrays take MXNet's own copy, equally
    unwaited, under NumPy-shape semantics (_np_shape_copy)."""
    ctx = getattr(plan.device, "ctx", None)
    pushed = []   # the copy, where the engine makes it (not one made at once)
    out = _engine.copy_leaf(nd, plan, ctx, pushed)
    if out is None:
        if ctx is None:
            ctx = nd.ctx   # mx.np arrays warn on .context
            if ctx.device_typeid == 5:  # cpu_shared: land the copy on cpu(0)
                ctx = mx.cpu(0)
        out = _np_shape_copy(nd, ctx)
        pushed.append(out)
    if pushed:
        _throttle(plan).append(out)
    if isinstance(nd, mx.np.ndarray) and not isinstance(out, mx.np.ndarray):
        out = out.as_np_ndarray()   # numpy-mode arrays stay mx.np (a second handle, no copy)
    return out


def _np_shape_copy(nd, ctx):
    """``nd.copyto(ctx)`` under NumPy-shape semantics.

    MXNet keeps that mode per thread (npx.set_np() sets it on the caller's
    thread only). The copying thread has its creator's (_modes), but an array
    may come from a thread in another mode, and in the legacy mode a 0-d
    shape or a 0 in a shape means "unknown": copying a 0-d or empty array
    fails there with "Operator _copyto inferring shapes failed". NumPy-shape
    semantics read every materialised array's shape as it is, so the copy
    runs under them whatever the thread's mode; the mode is restored after.
    """
    prev = ctypes.c_int()
    check_call(_LIB.MXSetIsNumpyShape(ctypes.c_int(1), ctypes.byref(prev)))
    try:
        return nd.copyto(ctx)
    finally:
        check_call(_LIB.MXSetIsNumpyShape(prev, ctypes.byref(ctypes.c_int())))


def _flatten_batch(batch):
    """Container hook for mx.io.DataBatch (and subclasses): every instance
    attribute is walked, not only data, label and index: pipelines add their
    own (a detection pipeline's ``im_info``), and an NDArray in any of them
    is copied; plain values (pad, bucket_key) pass through."""
    state = vars(batch)
    return list(state.values()), (batch, list(state))


def _unflatten_batch(aux, children):
    batch, names = aux
    # Every attribute is replaced below, so an exact DataBatch needs only a
    # blank instance (what copy.copy makes first, minus ~5 us of its protocol);
    # a subclass may keep state elsewhere (__slots__, __reduce__).
    new = object.__new__(_DataBatch) if type(batch) is _DataBatch else copy.copy(batch)
    new.__dict__.update(zip(names, children))
    return new


def engine_sync():
    """Wait until the engine has run every pending op, frees included (a pool
    block behind a dropped NDArray goes back only when MXNet frees it, after
    the ops on it). Skipped on a thread MXNet created (a deleter that ran a
    finalizer): waiting for the engine there would wait for itself."""
    _previous.clear()   # a prefetcher closed: hold no source arrays (a throttle only)
    if isinstance(threading.current_thread(), threading._DummyThread):
        return
    _engine.wait_all()


register_leaf(mx.nd.NDArray, _copy_ndarray, close=engine_sync)
_DataBatch = mx.io.DataBatch
register_container(_DataBatch, _flatten_batch, _unflatten_batch)
