# cython: language_level=3
# _engine.pyx: NDArray copies issued to MXNet's engine from C.
#
# Why: the Python path cost ~12 us of ctypes calls per leaf and blocked the
# copying thread on the engine (wait_to_read) for every leaf. Here a leaf costs a
# few C calls into the libmxnet that MXNet already loaded: read shape, dtype,
# context and storage type, make the destination NDArray, and push one
# `_copyto` op. The engine's dependency tracking orders that copy after the op
# that writes the source and before every later use of the copy (asnumpy(),
# wait_to_read(), any operator, the DLPack export), so nobody waits here.
#
# Nothing links against libmxnet at build time: the function addresses are
# taken once, at import, from mxnet.base._LIB (a ctypes.CDLL) and cast to the
# C signatures below, copied from MXNet 1.9.1's include/mxnet/c_api.h and
# include/dlpack/dlpack.h.
#
# Threads: copy_leaf and wrap_numpy run on the thread that copies a batch
# (a Prefetcher's publisher thread, a Loader's threads) with the GIL held; the DLPack deleters run wherever MXNet frees an NDArray, often
# an engine worker thread.
from cpython.ref cimport Py_INCREF, PyObject
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cimport numpy as cnp

from prefetch._framework cimport CopyPlan, pf_block, put_block, take_block

import ctypes

from prefetch.mx._mxnet import _LIB, NDArrayHandle, mx, nd_module

cnp.import_array()

cdef extern from *:
    """
    #if PY_VERSION_HEX >= 0x030D0000
    #define PF_IS_FINALIZING() Py_IsFinalizing()
    #else
    #define PF_IS_FINALIZING() _Py_IsFinalizing()
    #endif
    """
    int PF_IS_FINALIZING() nogil
    ctypedef int PyGILState_STATE
    PyGILState_STATE PyGILState_Ensure() nogil
    void PyGILState_Release(PyGILState_STATE) nogil
    # Py_DECREF by hand, for the deleter below that takes the GIL itself.
    void decref_held "Py_DECREF"(PyObject *) nogil

# MXNet's enums (include/mxnet/base.h, ndarray.h): Context::DeviceType,
# NDArrayStorageType; MXNet's NDArrays have at most 32 dimensions (TShape).
cdef enum:
    DEV_CPU = 1
    DEV_CPU_PINNED = 3
    DEV_CPU_SHARED = 5
    STYPE_DEFAULT = 0
    MAX_NDIM = 32
    N_DTYPES = 13

ctypedef void *Handle
ctypedef int (*GetShape32)(Handle, int *, const int **) noexcept nogil
ctypedef int (*GetShape64)(Handle, int *, const int64_t **) noexcept nogil
ctypedef int (*GetInt)(Handle, int *) noexcept nogil
ctypedef int (*GetContext)(Handle, int *, int *) noexcept nogil
ctypedef int (*Create32)(const uint32_t *, uint32_t, int, int, int, int, Handle *) noexcept nogil
ctypedef int (*Create64)(const int64_t *, int, int, int, int, int, Handle *) noexcept nogil
ctypedef int (*Invoke)(Handle, int, Handle *, int *, Handle **, int, const char **,
                       const char **) noexcept nogil
ctypedef int (*OneHandle)(Handle) noexcept nogil
ctypedef int (*GetData)(Handle, void **) noexcept nogil
ctypedef int (*NoArgs)() noexcept nogil
ctypedef const char *(*LastError)() noexcept nogil
ctypedef int (*OpHandle)(const char *, Handle *) noexcept nogil

# DLPack v0.2, as MXNet 1.9.1 ships it (DLContext, not DLDevice).
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
ctypedef int (*FromDLPack)(DLManagedTensor *, bint, Handle *) noexcept nogil

# What an NDArray over memory we own holds: the DLPack description (MXNet
# keeps this struct: transient_handle=False) and the owner of the memory, given
# back by the deleter when MXNet frees the NDArray, which it does only after
# every engine op on it has run (the ops hold the NDArray until then).
ctypedef struct Holder:
    DLManagedTensor managed    # first: the deleter gets its address
    pf_block *blk              # a pool block, or NULL
    PyObject *owner            # or a Python object (a numpy array), or NULL
    int64_t shape[MAX_NDIM]

# Below this a copy is cheaper than releasing the GIL and getting it back (the
# core draws the same line). Above it the calls run without the GIL, in case
# the engine runs the copy inline (MXNET_ENGINE_TYPE=NaiveEngine).
cdef size_t NOGIL_MIN_BYTES = 1 << 16
# Bytes per element of MXNet's dtype codes (mshadow's TypeFlag): float32,
# float64, float16, uint8, int32, int8, int64, bool, int16, uint16, uint32,
# uint64, bfloat16.
cdef int ITEMSIZE[N_DTYPES]
ITEMSIZE[:] = [4, 8, 2, 1, 4, 1, 8, 1, 2, 2, 4, 8, 2]
# The DLPack (code, bits) of the first 8, as MXNet's TBlob maps them back
# (kDLFloat 2, kDLUInt 1, kDLInt 0; bool is a 1-bit uint). MXNet refuses the
# others over DLPack: they get a destination MXNet allocates.
cdef uint8_t DL_CODE[8]
cdef uint8_t DL_BITS[8]
DL_CODE[:] = [2, 2, 2, 1, 0, 0, 0, 1]
DL_BITS[:] = [32, 64, 16, 8, 32, 8, 64, 1]
# numpy type numbers of those 8 dtypes, in the same order.
cdef int NPY_OF[8]
NPY_OF[:] = [cnp.NPY_FLOAT32, cnp.NPY_FLOAT64, cnp.NPY_FLOAT16, cnp.NPY_UINT8,
             cnp.NPY_INT32, cnp.NPY_INT8, cnp.NPY_INT64, cnp.NPY_BOOL]


cdef size_t _address(name):
    return <size_t>ctypes.cast(getattr(_LIB, name), ctypes.c_void_p).value


# An MXNet built with INT64_TENSOR_SIZE has only the ...64 shape calls working.
cdef bint _int64 = nd_module._int64_enabled()
cdef GetShape32 _get_shape32 = NULL if _int64 else <GetShape32>_address("MXNDArrayGetShapeEx")
cdef GetShape64 _get_shape64 = <GetShape64>_address("MXNDArrayGetShapeEx64") if _int64 else NULL
cdef Create32 _create32 = NULL if _int64 else <Create32>_address("MXNDArrayCreateEx")
cdef Create64 _create64 = <Create64>_address("MXNDArrayCreateEx64") if _int64 else NULL
cdef GetInt _get_dtype = <GetInt>_address("MXNDArrayGetDType")
cdef GetInt _get_stype = <GetInt>_address("MXNDArrayGetStorageType")
cdef GetContext _get_context = <GetContext>_address("MXNDArrayGetContext")
cdef Invoke _invoke = <Invoke>_address("MXImperativeInvoke")
cdef FromDLPack _from_dlpack = <FromDLPack>_address("MXNDArrayFromDLPackEx")
cdef OneHandle _free = <OneHandle>_address("MXNDArrayFree")
cdef OneHandle _wait_to_read = <OneHandle>_address("MXNDArrayWaitToRead")
cdef GetData _get_data = <GetData>_address("MXNDArrayGetData")
cdef NoArgs _wait_all = <NoArgs>_address("MXNDArrayWaitAll")
cdef LastError _last_error = <LastError>_address("MXGetLastError")
cdef Handle _copyto_op = NULL
if (<OpHandle>_address("NNGetOpHandle"))(b"_copyto", &_copyto_op) != 0 or _copyto_op == NULL:
    raise ImportError("prefetch.mx: this MXNet has no _copyto operator")

_NDArray = mx.nd.NDArray
_NP_NDArray = mx.np.ndarray


cdef int _error() except -1:
    # MXGetLastError is per thread: read it on the thread whose call failed.
    raise mx.base.MXNetError((<bytes>_last_error()).decode("utf-8", "replace"))


cdef inline Handle _handle_of(object nd) except? NULL:
    h = nd.handle.value
    if h is None:
        raise ValueError(f"prefetch.mx: an NDArray without a handle (freed?): {type(nd).__name__}")
    return <Handle><size_t>h


cdef size_t _layout(Handle h, int *dtype, int *ndim, int64_t *shape) except? 0:
    """The bytes of ``h``'s values, with its dtype, ndim and shape (copied out
    of MXNet's per-thread buffer); 0 where it has none (0-d, empty) or they
    are not known (0 is "unknown" in MXNet's legacy shape semantics)."""
    cdef int i, rc
    cdef const int *shape32 = NULL
    cdef const int64_t *shape64 = NULL
    cdef size_t nbytes
    if _get_dtype(h, dtype) != 0:
        _error()
    if _int64:
        rc = _get_shape64(h, ndim, &shape64)
    else:
        rc = _get_shape32(h, ndim, &shape32)
    if rc != 0:
        _error()
    if not (1 <= ndim[0] <= MAX_NDIM and 0 <= dtype[0] < N_DTYPES):
        return 0
    nbytes = ITEMSIZE[dtype[0]]
    for i in range(ndim[0]):
        shape[i] = shape64[i] if _int64 else shape32[i]
        if shape[i] <= 0:
            return 0
        nbytes *= <size_t>shape[i]
    return nbytes


cdef object _ndarray(Handle h, object cls=_NDArray):
    """The Python ``cls`` (an NDArray type) owning handle ``h`` (freed if that fails)."""
    try:
        return cls(NDArrayHandle(<size_t>h))
    except BaseException:
        _free(h)
        raise


# -- destinations we own ------------------------------------------------------

cdef void _release(DLManagedTensor *managed) noexcept nogil:
    # MXNet freed the NDArray: every engine op on it has run. Any thread.
    cdef Holder *h = <Holder *>managed
    cdef PyGILState_STATE gil
    if h.blk != NULL:
        put_block(h.blk)       # C only: safe on an engine thread
    if h.owner != NULL:
        # A numpy array: dropping it needs the GIL. MXNet frees NDArrays at
        # exit after Python is gone; then leak it rather than touch Python.
        if not PF_IS_FINALIZING():
            gil = PyGILState_Ensure()
            decref_held(h.owner)
            PyGILState_Release(gil)
    free(h)


cdef Holder *_holder(void *data, int ndim, const int64_t *shape, int dtype) except NULL:
    cdef Holder *h = <Holder *>malloc(sizeof(Holder))
    cdef int i
    if h == NULL:
        raise MemoryError("prefetch.mx: out of memory")
    h.blk = NULL
    h.owner = NULL
    h.managed.dl_tensor.data = data
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


cdef int _wrap(Holder *h, Handle *out) noexcept nogil:
    """An NDArray on cpu(0) over ``h``'s memory; on failure ``h`` is released."""
    cdef int rc = _from_dlpack(&h.managed, False, out)
    if rc != 0:
        out[0] = NULL
        _release(&h.managed)
    return rc


cdef int _push_copy(Handle src, int ndim, const int64_t *shape, int dtype, int dev_type,
                    int dev_id, Holder *h, Handle *out) noexcept nogil:
    """Make the destination and push the copy; 0, or MXNet's -1 with *out NULL
    and nothing leaked. The destination is the memory behind ``h`` when given,
    else MXNet's own (delay-allocated, as NDArray.copyto does)."""
    cdef uint32_t shape32[MAX_NDIM]
    cdef int i, rc, nout = 1
    cdef Handle dst = NULL
    cdef Handle *outs = &dst
    if h != NULL:
        rc = _wrap(h, &dst)
    elif _int64:
        rc = _create64(shape, ndim, dev_type, dev_id, 1, dtype, &dst)
    else:
        for i in range(ndim):
            shape32[i] = <uint32_t>shape[i]
        rc = _create32(shape32, <uint32_t>ndim, dev_type, dev_id, 1, dtype, &dst)
    if rc == 0:
        rc = _invoke(_copyto_op, 1, &src, &nout, &outs, 0, NULL, NULL)
        if rc != 0:
            _free(dst)         # a block behind it goes back through _release
    out[0] = dst if rc == 0 else NULL
    return rc


cdef int _copy_now(Handle src, size_t nbytes, Holder *h, Handle *out) noexcept:
    """A small host array copied here, not by the engine: once the source's
    pending writes have run (usually none: MXNet returns at once), its bytes
    go into ``h``'s memory, wrapped as an NDArray with no op pending on it.
    A consumer's wait_to_read() then returns at once, where an engine copy
    would cost it a wake-up of an engine thread per batch. 0; MXNet's -1
    with *out NULL and ``h`` released; 1 when MXNet gives no data pointer
    (the engine copies it then)."""
    cdef void *data = NULL
    cdef int rc
    with nogil:
        rc = _wait_to_read(src)
    if rc == 0:
        rc = _get_data(src, &data)
    if rc != 0:
        out[0] = NULL
        _release(&h.managed)
        return rc
    if data == NULL:
        return 1
    memcpy(h.managed.dl_tensor.data, data, nbytes)
    return _wrap(h, out)


# -- the calls the adapter makes ----------------------------------------------

def copy_leaf(object nd, CopyPlan plan=None, object ctx=None, list pushed=None):
    """A fresh NDArray with ``nd``'s shape, dtype and values, or None.

    On ``ctx`` (an mx.Context) when given, else on ``nd``'s own context, but
    cpu_shared becomes cpu(0) (it only carries a DataLoader's batch between
    processes). On cpu(0), with ``plan``, the copy lands in a block of the
    plan's pool, which goes back to the pool when MXNet frees the NDArray.
    An ``mx.np.ndarray`` comes out as one (numpy-mode Gluon blocks take no
    other), any other NDArray as an ``mx.nd.NDArray``.
    The copy is issued to the engine, not waited for (and appended to
    ``pushed`` when given); a small array on the host going to cpu(0) with
    ``plan`` is copied here instead (``_copy_now``). None when this path
    does not apply (sparse storage, 0-d, an empty or unknown shape): the
    caller then copies through Python.
    """
    cdef Handle src = _handle_of(nd)
    cdef Handle dst = NULL
    cdef Holder *h = NULL
    cdef pf_block *blk
    cdef int ndim = 0, dtype = 0, stype = 0, dev_type = 0, dev_id = 0, rc = 1
    cdef int64_t shape[MAX_NDIM]
    cdef size_t nbytes
    cdef bint on_host, now = False   # now: a small host array, copied here
    if _get_stype(src, &stype) != 0:
        _error()
    nbytes = _layout(src, &dtype, &ndim, shape)
    if stype != STYPE_DEFAULT or nbytes == 0:
        return None
    if _get_context(src, &dev_type, &dev_id) != 0:   # asked first: an error leaks no block
        _error()
    on_host = dev_type == DEV_CPU or dev_type == DEV_CPU_PINNED or dev_type == DEV_CPU_SHARED
    if ctx is not None:
        dev_type, dev_id = ctx.device_typeid, ctx.device_id
    elif dev_type == DEV_CPU_SHARED:
        dev_type, dev_id = DEV_CPU, 0
    if plan is not None and dev_type == DEV_CPU and dev_id == 0 and dtype < 8:
        now = nbytes < NOGIL_MIN_BYTES and on_host
        blk = take_block(plan, nbytes)
        try:
            h = _holder(blk.data, ndim, shape, dtype)
        except BaseException:
            put_block(blk)
            raise
        h.blk = blk
    if now:
        rc = _copy_now(src, nbytes, h, &dst)
        if rc == 0:
            pushed = None   # no engine op to wait for
    if rc == 1 and nbytes >= NOGIL_MIN_BYTES:
        with nogil:
            rc = _push_copy(src, ndim, shape, dtype, dev_type, dev_id, h, &dst)
    elif rc == 1:
        rc = _push_copy(src, ndim, shape, dtype, dev_type, dev_id, h, &dst)
    if rc != 0:
        _error()
    if plan is not None and h == NULL:
        plan.nbytes += nbytes  # a copy elsewhere (a device) also counts for max_bytes, stats
    out = _ndarray(dst, _NP_NDArray if isinstance(nd, _NP_NDArray) else _NDArray)
    if pushed is not None:
        pushed.append(out)
    return out


def wrap_numpy(cnp.ndarray a, object ctx):
    """``a`` as an NDArray on ``ctx``, or None when DLPack cannot carry it.

    ``a`` is a fresh pool-backed copy (C-contiguous, native order, not empty):
    on cpu(0) the NDArray is over its memory (and keeps it alive); elsewhere
    the engine copies it there, not waited for.
    """
    cdef int dtype, ndim = cnp.PyArray_NDIM(a), i, rc = 0, nout = 1
    cdef int typenum = cnp.PyArray_TYPE(a)
    cdef int64_t shape[MAX_NDIM]
    cdef Holder *h
    cdef Handle host = NULL, dst = NULL
    if not (cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISNOTSWAPPED(a)
            and 1 <= ndim <= MAX_NDIM and cnp.PyArray_SIZE(a) > 0):
        return None
    for dtype in range(8):
        if NPY_OF[dtype] == typenum:
            break
    else:
        return None
    for i in range(ndim):
        shape[i] = cnp.PyArray_DIMS(a)[i]
    h = _holder(cnp.PyArray_DATA(a), ndim, shape, dtype)
    Py_INCREF(a)
    h.owner = <PyObject *>a
    if _wrap(h, &host) != 0:
        _error()
    if ctx.device_typeid == DEV_CPU and ctx.device_id == 0:
        return _ndarray(host)
    rc = _push_copy(host, ndim, shape, dtype, ctx.device_typeid, ctx.device_id, NULL, &dst)
    _free(host)   # the pending copy holds it until it has run
    if rc != 0:
        _error()
    return _ndarray(dst)


def wait_written(list nds):
    """Return when no engine op still writes the NDArrays in ``nds``
    (MXNDArrayWaitToRead, without the GIL): e.g. the copies into them have
    run. Not at all when they hold less than NOGIL_MIN_BYTES in all: a
    backlog of small arrays costs nothing (malloc reuses them without page
    faults), a wait a thread wake-up."""
    cdef Py_ssize_t i, n = len(nds)
    cdef int rc = 0, dtype = 0, ndim = 0
    cdef int64_t shape[MAX_NDIM]
    cdef size_t nbytes = 0
    cdef Handle *hs = <Handle *>malloc(n * sizeof(Handle) + 1)   # + 1: malloc(0) may give NULL
    if hs == NULL:
        raise MemoryError("prefetch.mx: out of memory")
    try:
        for i in range(n):
            hs[i] = _handle_of(nds[i])
            nbytes += _layout(hs[i], &dtype, &ndim, shape)
        if nbytes < NOGIL_MIN_BYTES:
            return
        with nogil:
            for i in range(n):
                rc = _wait_to_read(hs[i])
                if rc != 0:
                    break
        if rc != 0:
            _error()
    finally:
        free(hs)


def wait_all():
    """MXNDArrayWaitAll without the GIL: every pushed op (frees included) has run."""
    cdef int rc
    with nogil:
        rc = _wait_all()
    if rc != 0:
        _error()
