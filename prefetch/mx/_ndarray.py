"""NDArray leaves and DataBatch containers (SPEC §3), registered on import.

Threading contract: ``_copy_ndarray`` and the DataBatch hooks run on a
prefetcher's fetch thread with the GIL held; ``engine_sync`` runs in close().
"""
import copy
import ctypes
import threading

import numpy as np

from prefetch.adapters import register_container, register_leaf
from prefetch.mx._mxnet import _LIB, NDArrayHandle, check_call, mx, nd_module

# numpy dtype -> DLPack (code, bits, lanes), as mx.nd.from_numpy maps them
# (DLDataType.TYPE_MAP, checked on 1.9.1: bool, uint8, int32, int64, float16/32/64).
# int8, uint32, ... take the engine-copy path.
_DL_DTYPES = {np.dtype(name): nd_module.DLDataType(*code)
              for name, code in nd_module.DLDataType.TYPE_MAP.items()
              if name not in ("uint32", "uint64")}  # MXNet rejects these two
_DL_CPU0 = nd_module.DLContext(1, 0)  # kDLCPU, device 0
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
    managed = nd_module.DLManagedTensor()
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
    managed.deleter = nd_module.dl_managed_tensor_deleter
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


def _copy_ndarray(nd, plan):
    """Leaf hook: a fresh NDArray with ``nd``'s shape, dtype and values.

    Host arrays: the core copies their memory into a pool block later in the
    batch, without the GIL, and the NDArray we return owns that block (DLPack
    keeps the numpy array alive until MXNet frees the NDArray).  Other contexts
    (GPU, cpu(k>0), cpu_pinned, sparse, dtypes DLPack cannot carry) are copied
    by the engine on their own context, complete before we return.
    """
    ctx = nd.context
    stype = nd.stype
    if stype == "default" and (
            (ctx.device_typeid == 1 and ctx.device_id == 0)  # cpu(0)
            # cpu_shared only carries a DataLoader's batch between processes;
            # the copy lands in the pool on cpu(0) and frees the shared segment.
            or ctx.device_typeid == 5):
        dtype = nd.dtype
        shape = nd.shape
        if dtype in _ZERO_COPY_TYPES and 0 not in shape:
            return _wrap_block(plan.array(_host_view(nd, shape, dtype)))
    out = nd.copy() if stype != "default" else nd.copyto(ctx)
    out.wait_to_read()
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
    """Wait until the engine has run every pending op, frees included (a dropped
    NDArray's memory is freed by an engine op, and a pool block behind one is
    released only then). Skipped on a thread MXNet created (a deleter callback
    that ran a finalizer): waiting for the engine there would wait for itself."""
    if isinstance(threading.current_thread(), threading._DummyThread):
        return
    mx.nd.waitall()


register_leaf(mx.nd.NDArray, _copy_ndarray, close=engine_sync)
register_container(mx.io.DataBatch, _flatten_batch, _unflatten_batch)
