# cython: language_level=3
# _engine.pyx: copy an NDArray leaf by issuing one engine op, from C (issue 9).
#
# Why: the Python path cost ~12 us of ctypes calls per leaf and blocked the
# fetch thread on the engine (wait_to_read) for every leaf. Here a leaf costs a
# few C calls into the libmxnet that MXNet already loaded: read shape, dtype,
# context and storage type, create the destination NDArray, and push one
# `_copyto` op. The engine's dependency tracking orders that copy after the
# op that produces the source and before every later use of the copy
# (asnumpy(), wait_to_read(), any operator), so nobody waits here.
#
# Nothing links against libmxnet at build time: the function addresses are
# taken once, at import, from mxnet.base._LIB (a ctypes.CDLL) and cast to the
# C signatures below, copied from MXNet 1.9.1's include/mxnet/c_api.h.
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

from prefetch._ring cimport _Core, pf_block, put_block, take_block

import ctypes
import warnings

with warnings.catch_warnings():
    # mxnet 1.9.1 touches np.bool at import: a DeprecationWarning on numpy 1.23.
    warnings.simplefilter("ignore", DeprecationWarning)
    from mxnet.base import _LIB, MXNetError, NDArrayHandle
    from mxnet.ndarray.ndarray import NDArray, _int64_enabled

# MXNet's enums (include/mxnet/base.h, ndarray.h): Context::DeviceType, NDArrayStorageType.
cdef enum:
    DEV_CPU = 1
    DEV_CPU_SHARED = 5
    STYPE_DEFAULT = 0
    MAX_NDIM = 32

ctypedef void *Handle
ctypedef int (*GetShape32)(Handle, int *, const int **) nogil
ctypedef int (*GetShape64)(Handle, int *, const int64_t **) nogil
ctypedef int (*GetInt)(Handle, int *) nogil
ctypedef int (*GetContext)(Handle, int *, int *) nogil
ctypedef int (*Create32)(const uint32_t *, uint32_t, int, int, int, int, Handle *) nogil
ctypedef int (*Create64)(const int64_t *, int, int, int, int, int, Handle *) nogil
ctypedef int (*Invoke)(Handle, int, Handle *, int *, Handle **, int, const char **,
                       const char **) nogil
ctypedef int (*Free)(Handle) nogil
ctypedef int (*WaitAll)() nogil
ctypedef const char *(*LastError)() nogil
ctypedef int (*OpHandle)(const char *, Handle *) nogil

# DLPack as MXNet 1.9.1 ships it (include/dlpack/dlpack.h, v0.2: DLContext).
ctypedef struct DLContext:
    int device_type
    int device_id
ctypedef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes
ctypedef struct DLTensor:
    void *data
    DLContext ctx
    int ndim
    DLDataType dtype
    int64_t *shape
    int64_t *strides
    uint64_t byte_offset
ctypedef struct DLManagedTensor:
    DLTensor dl_tensor
    void *manager_ctx
    void (*deleter)(DLManagedTensor *) noexcept nogil
ctypedef int (*FromDLPack)(DLManagedTensor *, bint, Handle *) nogil

# What MXNet's NDArray over a pool block holds: the DLPack description it reads
# (shape included: with transient_handle=False MXNet keeps this struct) and the
# block, given back by _release when MXNet frees the NDArray.
ctypedef struct Holder:
    DLManagedTensor managed   # first: the deleter gets its address
    pf_block *blk
    int64_t shape[MAX_NDIM]

# Below this a copy is cheaper than releasing the GIL and getting it back
# (the core draws the same line); above it the calls run without the GIL in
# case the engine runs the copy inline (MXNET_ENGINE_TYPE=NaiveEngine).
cdef size_t NOGIL_MIN_BYTES = 1 << 16
# Bytes per element of MXNet's dtype codes 0..12 (mshadow's TypeFlag):
# float32, float64, float16, uint8, int32, int8, int64, bool, int16, uint16,
# uint32, uint64, bfloat16.
cdef int ITEMSIZE[13]
ITEMSIZE[:] = [4, 8, 2, 1, 4, 1, 8, 1, 2, 2, 4, 8, 2]
# Their DLPack (code, bits) for the first 8, as MXNet's TBlob maps them back
# (kDLFloat 2, kDLUInt 1, kDLInt 0; bool is 1-bit uint); the rest (int16,
# uint16, uint32, uint64, bfloat16) get an engine-allocated destination.
cdef uint8_t DL_CODE[8]
cdef uint8_t DL_BITS[8]
DL_CODE[:] = [2, 2, 2, 1, 0, 0, 0, 1]
DL_BITS[:] = [32, 64, 16, 8, 32, 8, 64, 1]

cdef bint _int64 = _int64_enabled()
cdef GetShape32 _get_shape32 = NULL
cdef GetShape64 _get_shape64 = NULL
cdef Create32 _create32 = NULL
cdef Create64 _create64 = NULL
cdef GetInt _get_dtype = <GetInt><size_t>ctypes.cast(_LIB.MXNDArrayGetDType, ctypes.c_void_p).value
cdef GetInt _get_stype = <GetInt><size_t>ctypes.cast(_LIB.MXNDArrayGetStorageType, ctypes.c_void_p).value
cdef GetContext _get_context = <GetContext><size_t>ctypes.cast(_LIB.MXNDArrayGetContext, ctypes.c_void_p).value
cdef Invoke _invoke = <Invoke><size_t>ctypes.cast(_LIB.MXImperativeInvoke, ctypes.c_void_p).value
cdef Free _free = <Free><size_t>ctypes.cast(_LIB.MXNDArrayFree, ctypes.c_void_p).value
cdef Free _wait_to_write = <Free><size_t>ctypes.cast(_LIB.MXNDArrayWaitToWrite, ctypes.c_void_p).value
cdef WaitAll _wait_all = <WaitAll><size_t>ctypes.cast(_LIB.MXNDArrayWaitAll, ctypes.c_void_p).value
cdef FromDLPack _from_dlpack = <FromDLPack><size_t>ctypes.cast(_LIB.MXNDArrayFromDLPackEx, ctypes.c_void_p).value
cdef LastError _last_error = <LastError><size_t>ctypes.cast(_LIB.MXGetLastError, ctypes.c_void_p).value
if _int64:
    _get_shape64 = <GetShape64><size_t>ctypes.cast(_LIB.MXNDArrayGetShapeEx64, ctypes.c_void_p).value
    _create64 = <Create64><size_t>ctypes.cast(_LIB.MXNDArrayCreateEx64, ctypes.c_void_p).value
else:
    _get_shape32 = <GetShape32><size_t>ctypes.cast(_LIB.MXNDArrayGetShapeEx, ctypes.c_void_p).value
    _create32 = <Create32><size_t>ctypes.cast(_LIB.MXNDArrayCreateEx, ctypes.c_void_p).value

cdef Handle _copyto_op = NULL
cdef OpHandle _op_handle = <OpHandle><size_t>ctypes.cast(_LIB.NNGetOpHandle, ctypes.c_void_p).value
if _op_handle(b"_copyto", &_copyto_op) != 0 or _copyto_op == NULL:
    raise ImportError("prefetch.mx: MXNet has no _copyto operator")


cdef int _error() except -1:
    # MXGetLastError is thread-local: read it on the thread whose call failed.
    raise MXNetError((<bytes>_last_error()).decode("utf-8", "replace"))


cdef size_t _nbytes(Handle h) except? 0:
    """Bytes of a default-storage NDArray's data; 0 when unknown."""
    cdef int ndim = 0, dtype = 0, i, rc
    cdef const int *shape32 = NULL
    cdef const int64_t *shape64 = NULL
    cdef size_t n
    if _get_dtype(h, &dtype) != 0:
        _error()
    if not 0 <= dtype < 13:
        return 0
    rc = _get_shape64(h, &ndim, &shape64) if _int64 else _get_shape32(h, &ndim, &shape32)
    if rc != 0:
        _error()
    n = ITEMSIZE[dtype]
    for i in range(ndim):
        n *= <size_t>(shape64[i] if _int64 else shape32[i])
    return n if ndim > 0 else 0


cdef inline Handle _handle_of(object nd) except? NULL:
    h = nd.handle.value
    if h is None:
        raise ValueError("prefetch.mx: an NDArray without a handle (it was freed)")
    return <Handle><size_t>h


cdef void _release(DLManagedTensor *managed) noexcept nogil:
    # MXNet's NDArray over a block is gone: every op on it has run (they hold
    # it until then). Any thread, often an engine worker: no Python here.
    cdef Holder *h = <Holder *>managed
    put_block(h.blk)
    free(h)


cdef int _push_copy(Handle src, int ndim, const int64_t *shape, int dtype, int dev_type,
                    int dev_id, Holder *h, Handle *out) noexcept nogil:
    """Create the destination and push the copy; 0 or MXNet's -1 (then *out is
    NULL and nothing leaks). The destination is the pool block behind ``h``
    when given, else MXNet's (delay-allocated, as NDArray.copyto does)."""
    cdef uint32_t shape32[MAX_NDIM]
    cdef int i, rc, nout = 1
    cdef Handle dst = NULL
    cdef Handle *outs = &dst
    if h != NULL:
        rc = _from_dlpack(&h.managed, False, &dst)
        if rc != 0:
            _release(&h.managed)
    elif _int64:
        rc = _create64(shape, ndim, dev_type, dev_id, 1, dtype, &dst)
    else:
        for i in range(ndim):
            shape32[i] = <uint32_t>shape[i]
        rc = _create32(shape32, <uint32_t>ndim, dev_type, dev_id, 1, dtype, &dst)
    if rc != 0:
        out[0] = NULL
        return rc
    rc = _invoke(_copyto_op, 1, &src, &nout, &outs, 0, NULL, NULL)
    if rc != 0:
        _free(dst)
        dst = NULL
    out[0] = dst
    return rc


cdef Holder *_holder(_Core core, int ndim, const int64_t *shape, int dtype,
                     size_t nbytes) except NULL:
    cdef Holder *h = <Holder *>malloc(sizeof(Holder))
    cdef int i
    if h == NULL:
        raise MemoryError("prefetch.mx: out of memory")
    try:
        h.blk = take_block(core, nbytes)
    except BaseException:
        free(h)
        raise
    h.managed.dl_tensor.data = h.blk.data
    h.managed.dl_tensor.ctx.device_type = DEV_CPU
    h.managed.dl_tensor.ctx.device_id = 0
    h.managed.dl_tensor.ndim = ndim
    h.managed.dl_tensor.dtype.code = DL_CODE[dtype]
    h.managed.dl_tensor.dtype.bits = DL_BITS[dtype]
    h.managed.dl_tensor.dtype.lanes = 1
    for i in range(ndim):
        h.shape[i] = shape[i]
    h.managed.dl_tensor.shape = h.shape
    h.managed.dl_tensor.strides = NULL   # C-contiguous
    h.managed.dl_tensor.byte_offset = 0
    h.managed.manager_ctx = NULL
    h.managed.deleter = _release
    return h


def copy_leaf(object nd, object core=None, object device=None):
    """A fresh NDArray with ``nd``'s shape, dtype and values, or None.

    On ``device`` (an mx.Context) when given, else on ``nd``'s own context
    (``cpu_shared`` becomes ``cpu(0)``: that context only carries a DataLoader's
    batch between processes). On cpu(0) the copy lands in a block of ``core``'s
    pool (a prefetcher's ``_Core``), which goes back to the pool when MXNet
    frees the NDArray. The copy is issued to the engine, not waited for.
    None when this path does not apply (sparse storage, 0-d, an empty or
    unknown shape, an unknown dtype): the caller copies through Python.
    """
    cdef Holder *h = NULL
    cdef Handle src = _handle_of(nd)
    cdef Handle dst = NULL
    cdef int ndim = 0, dtype = 0, stype = 0, dev_type = 0, dev_id = 0, i, rc
    cdef const int *shape32 = NULL
    cdef const int64_t *shape64 = NULL
    cdef int64_t shape[MAX_NDIM]
    cdef size_t nbytes
    if _get_stype(src, &stype) != 0 or _get_dtype(src, &dtype) != 0:
        _error()
    if stype != STYPE_DEFAULT or not 0 <= dtype < 13:
        return None
    if _int64:
        rc = _get_shape64(src, &ndim, &shape64)
    else:
        rc = _get_shape32(src, &ndim, &shape32)
    if rc != 0:
        _error()
    if ndim < 1 or ndim > MAX_NDIM:
        return None
    nbytes = ITEMSIZE[dtype]
    for i in range(ndim):
        # The shape buffer is MXNet's thread-local: copy it before the next call.
        shape[i] = shape64[i] if _int64 else shape32[i]
        if shape[i] <= 0:   # 0 is "unknown" in MXNet's legacy shape semantics
            return None
        nbytes *= <size_t>shape[i]
    if device is None:
        if _get_context(src, &dev_type, &dev_id) != 0:
            _error()
        if dev_type == DEV_CPU_SHARED:
            dev_type, dev_id = DEV_CPU, 0
    else:
        dev_type, dev_id = device.device_typeid, device.device_id
    if core is not None and dev_type == DEV_CPU and dev_id == 0 and dtype < 8:
        h = _holder(<_Core?>core, ndim, shape, dtype, nbytes)
    if nbytes >= NOGIL_MIN_BYTES:
        with nogil:
            rc = _push_copy(src, ndim, shape, dtype, dev_type, dev_id, h, &dst)
    else:
        rc = _push_copy(src, ndim, shape, dtype, dev_type, dev_id, h, &dst)
    if rc != 0:
        _error()
    try:
        return NDArray(NDArrayHandle(<size_t>dst))
    except BaseException:
        _free(dst)
        raise


def wait_all():
    """MXNDArrayWaitAll without the GIL: every pushed op (frees included) has run."""
    cdef int rc
    with nogil:
        rc = _wait_all()
    if rc != 0:
        _error()


def wait_unused(list nds):
    """Return when no engine op still reads or writes any NDArray in ``nds``
    (MXNDArrayWaitToWrite on each, without the GIL): e.g. the copies of the
    previous batch have read its source arrays. Not when they hold less than
    NOGIL_MIN_BYTES in all: a backlog of small arrays costs nothing (malloc
    reuses them without page faults), and a wait costs a thread wake-up."""
    cdef Py_ssize_t i, n = len(nds)
    cdef int rc = 0
    cdef Handle *hs
    cdef size_t nbytes = 0
    for i in range(n):
        nbytes += _nbytes(_handle_of(nds[i]))
    if nbytes < NOGIL_MIN_BYTES:
        return
    hs = <Handle *>malloc(n * sizeof(Handle))
    if hs == NULL:
        raise MemoryError("prefetch.mx: out of memory")
    try:
        for i in range(n):
            hs[i] = _handle_of(nds[i])
        with nogil:
            for i in range(n):
                rc = _wait_to_write(hs[i])
                if rc != 0:
                    break
        if rc != 0:
            _error()
    finally:
        free(hs)
