"""NDArray leaves and DataBatch containers, registered on import.

Threading contract: ``_copy_ndarray`` and the DataBatch hooks run on a
prefetcher's fetch thread with the GIL held; ``engine_sync`` runs in close().
"""
import copy
import threading
import weakref

from prefetch.adapters import register_container, register_leaf
from prefetch.mx import _engine
from prefetch.mx._mxnet import mx

# CopyPlan (one per prefetcher) -> [its batch number, the copies made in that
# batch]. See _throttle.
_previous = weakref.WeakKeyDictionary()


def _throttle(plan):
    """At a batch's first NDArray: wait until the engine has run the previous
    batch's copies. The fetch thread then runs at most about one batch ahead
    of the engine, so a source that allocates every batch (an NDArrayIter's
    slices, a DataLoader's stacked batch) keeps no backlog of large arrays
    alive, each a fresh allocation that page-faults (measured with a Gluon
    DataLoader of 10 MB batches: up to 2x the time per batch without). It holds
    the copies, never the sources: the core drops a source's batch before the
    next next(source), for sources that refill one buffer. Returns the list
    this batch's copies go into."""
    state = _previous.get(plan)
    if state is None:
        state = _previous[plan] = [plan.batches, []]
    elif state[0] != plan.batches:
        last, state[1] = state[1], []
        state[0] = plan.batches
        _engine.wait_written(last)
    return state[1]


def _copy_ndarray(nd, plan):
    """Leaf hook: a fresh NDArray with ``nd``'s shape, dtype and values.

    One engine op, issued from C (``_engine.copy_leaf``), copies ``nd`` straight
    to where the leaf is handed out: the prefetcher's device context if it has
    one, else a pool block on cpu(0) (or ``nd``'s own context when that is not
    cpu(0) or cpu_shared). The engine orders the copy after the op that writes
    ``nd`` and before every use of the result (the batch is complete
    for every reader), so the copy is not waited for; only the previous
    batch's, once per batch (_throttle). Sparse, 0-d and empty arrays take
    MXNet's own copy, equally unwaited.
    """
    copies = _throttle(plan)
    ctx = getattr(plan.device, "ctx", None)
    out = _engine.copy_leaf(nd, plan, ctx)
    if out is None:
        if ctx is None:
            ctx = nd.context
            if ctx.device_typeid == 5:  # cpu_shared: land the copy on cpu(0)
                ctx = mx.cpu(0)
        out = nd.copyto(ctx)
    copies.append(out)
    return out


def _flatten_batch(batch):
    """Container hook for mx.io.DataBatch (and subclasses): data, label and
    index are walked; pad, bucket_key and provide_data/provide_label pass through."""
    return (batch.data, batch.label, batch.index), batch


def _unflatten_batch(batch, children):
    new = copy.copy(batch)
    new.data, new.label, new.index = children
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
register_container(mx.io.DataBatch, _flatten_batch, _unflatten_batch)
