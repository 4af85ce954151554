"""NDArray leaves and DataBatch containers (SPEC §3), registered on import.

Threading contract: ``_copy_ndarray`` and the DataBatch hooks run on a
prefetcher's fetch thread with the GIL held; ``engine_sync`` runs in close().
"""
import copy
import threading

from prefetch.adapters import register_container, register_leaf
from prefetch.mx import _engine
from prefetch.mx._mxnet import mx


def _copy_ndarray(nd, plan):
    """Leaf hook: a fresh NDArray with ``nd``'s shape, dtype and values.

    One engine op, issued from C (``_engine.copy_leaf``), copies ``nd`` straight
    to where the leaf is handed out: the prefetcher's device context if it has
    one, else a pool block on cpu(0) (or ``nd``'s own context when that is not
    cpu(0) or cpu_shared). The engine orders the copy after the op that writes
    ``nd`` and before every use of the result, so nothing waits here (SPEC §3:
    the batch is complete for every reader). Sparse, 0-d and empty arrays take
    MXNet's own copy, equally unwaited.
    """
    delivery = plan.device
    ctx = getattr(delivery, "ctx", None)
    out = _engine.copy_leaf(nd, plan, ctx)
    if out is None:
        if ctx is None:
            ctx = nd.context
            if ctx.device_typeid == 5:  # cpu_shared: land the copy on cpu(0)
                ctx = mx.cpu(0)
        out = nd.copyto(ctx)
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
    if isinstance(threading.current_thread(), threading._DummyThread):
        return
    _engine.wait_all()


register_leaf(mx.nd.NDArray, _copy_ndarray, close=engine_sync)
register_container(mx.io.DataBatch, _flatten_batch, _unflatten_batch)
