"""``device=`` an MXNet context (SPEC §2, §5): validated once, in the
Prefetcher's constructor; every array leaf delivered there as an NDArray; the
engine synchronised once, at close.

Threading contract: ``deliver`` and ``ready`` run on the fetch thread with the
GIL held, after the batch's host copies are complete; ``close`` in close().
"""
import numpy as np

from prefetch.adapters import register_device
from prefetch.mx._mxnet import mx
from prefetch.mx._ndarray import _DL_DTYPES, _wrap_block, engine_sync

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
    """The Delivery (prefetch.adapters) for one prefetcher's MXNet context."""

    def __init__(self, device):
        self.ctx = as_context(device)
        self.on_cpu0 = self.ctx == mx.cpu(0)
        self.moved = []   # this batch's engine copies, waited for in ready()

    def deliver(self, leaf):
        if type(leaf) is np.ndarray and leaf.dtype in _MX_DTYPES:
            # A fresh pool-backed copy: wrap its block without a copy when
            # DLPack can carry it, then move it like any host NDArray.
            if leaf.dtype in _DL_DTYPES and leaf.size:
                leaf = _wrap_block(leaf)
            else:
                leaf = mx.nd.array(leaf, ctx=mx.cpu(0), dtype=leaf.dtype)
            if self.on_cpu0:
                return leaf
        if isinstance(leaf, mx.nd.NDArray) and leaf.context != self.ctx:
            leaf = leaf.copyto(self.ctx)
            self.moved.append(leaf)
        return leaf

    def ready(self):
        moved, self.moved = self.moved, []
        for nd in moved:
            nd.wait_to_read()  # ctypes call: the GIL is released while it waits

    def close(self):
        # The same hook as the NDArray leaves': a prefetcher runs it once.
        engine_sync()


register_device(mx.Context, ContextDelivery)
