"""``device=`` an MXNet context: validated once, in the
prefetcher's or loader's constructor; every array leaf delivered there as an NDArray; the
engine synchronised once, at close.

Threading contract: ``deliver`` and ``ready`` run on the publisher thread with the
GIL held, after the batch's host copies are complete; ``close`` in close().
NDArray leaves were already copied to the context by their leaf hook
(prefetch.mx._ndarray reads ``plan.device.ctx``).
"""
import numpy as np

from prefetch._framework import register_device
from prefetch.mx import _engine
from prefetch.mx._mxnet import mx
from prefetch.mx._ndarray import _np_shape_copy, engine_sync

# numpy dtypes an NDArray can hold (device= delivers these leaves as NDArrays;
# object, string, complex and structured arrays stay numpy).
_MX_DTYPES = frozenset(np.dtype(t) for t in
                       ("float16", "float32", "float64", "uint8", "int8", "int32", "int64", "bool"))


def as_context(device):
    """``device`` if it is a usable MXNet context; else TypeError/ValueError naming it."""
    if not isinstance(device, mx.Context):
        raise TypeError(
            "device must be an MXNet context such as mx.gpu(0), mx.cpu_pinned(0) "
            f"or mx.cpu(1), got {device!r}")
    if device.device_type == "gpu" and device.device_id >= mx.context.num_gpus():
        raise ValueError(
            f"device={device!r}: this MXNet sees {mx.context.num_gpus()} GPU(s)")
    return device


class ContextDelivery:
    """The Delivery (prefetch.adapters) for one prefetcher's or loader's MXNet context."""

    def __init__(self, device):
        self.ctx = as_context(device)

    def deliver(self, leaf):
        if type(leaf) is np.ndarray and leaf.dtype in _MX_DTYPES:
            # A fresh pool-backed copy: an NDArray over its block on cpu(0),
            # else one engine copy to the context (DLPack wraps it in C).
            out = _engine.wrap_numpy(leaf, self.ctx)
            if out is None:  # empty, 0-d, or a dtype DLPack cannot carry
                out = mx.nd.array(leaf, ctx=self.ctx, dtype=leaf.dtype)
            return out
        if isinstance(leaf, mx.nd.NDArray) and leaf.ctx != self.ctx:
            out = _engine.copy_leaf(leaf, None, self.ctx)  # e.g. a container's own copy
            return _np_shape_copy(leaf, self.ctx) if out is None else out
        return leaf

    def ready(self):
        # Nothing to wait for: the engine orders every use of the batch after
        # its copies (SPEC §3), and close() synchronises it once (SPEC §5).
        pass

    # The NDArray leaves' close hook itself: a prefetcher's close runs the
    # two as one, so the engine is synchronised once (SPEC §5).
    close = staticmethod(engine_sync)


def device_hint(name):
    """What to pass as device= instead of the string ``name``, or None (no MXNet context name)."""
    kind, _, index = name.strip().lower().partition(":")
    n = index if index.isdigit() else "0"
    return {"gpu": f"mx.gpu({n}) (MXNet)", "cuda": f"mx.gpu({n}) (MXNet)", "cpu": "mx.cpu() (MXNet)",
            "cpu_pinned": f"mx.cpu_pinned({n}) (MXNet)"}.get(kind)


register_device(mx.Context, ContextDelivery, hint=device_hint)
