# _copy.pxi (included by _core.pyx): a batch's copies into pool blocks.
#
# While the tree is walked (fetch thread, GIL held), each array leaf gets a
# pool block and an output array over it, and its memcpy is queued; _run then
# does every queued memcpy without the GIL, split across the copier's helper
# threads. Leaf adapters (prefetch.adapters.register_leaf) receive the
# CopyPlan and call plan.array(a) for the memory they need copied.

cdef extern from "numpy/arrayobject.h":
    # dtype flag: the items hold references (object fields, StringDType).
    enum: NPY_ITEM_REFCOUNT
    # Cython's numpy.pxd leaves this one out; it steals a reference to descr.
    object PyArray_NewFromDescr(object subtype, cnp.PyArray_Descr *descr, int nd,
                                cnp.npy_intp *dims, cnp.npy_intp *strides, void *data,
                                int flags, object obj)
    void Py_INCREF_Descr "Py_INCREF"(cnp.PyArray_Descr *)

# Below this, releasing the GIL (and waking the other thread that wants it)
# costs more than the memcpy itself; numpy draws the same line.
cdef size_t NOGIL_MIN_BYTES = 1 << 16


cdef class _Block:
    def __cinit__(self):
        self.blk = NULL

    def __dealloc__(self):
        if self.blk != NULL:
            pf_pool_put(self.blk)


cdef class CopyPlan:
    """The copies of the batch being fetched, handed to leaf adapters.

    ``array(a)`` returns a fresh C-contiguous pool-backed array with ``a``'s
    shape and dtype, whose bytes are copied from ``a`` later in this batch,
    without the GIL, before the batch is delivered or published: wrap it, do
    not read it. ``device`` is the prefetcher's device delivery, or None.
    """

    def __cinit__(self):
        self._jobs = NULL
        self._strided = []
        self._sources = []
        self.closers = set()

    def __dealloc__(self):
        free(self._jobs)

    def __init__(self):
        raise TypeError("CopyPlan objects are made by the prefetcher, not by users")

    cdef void _reset(self):
        self.batches += 1
        self._njobs = 0
        self.nbytes = 0
        self._strided = []
        self._sources = []
        if self.device is not None:
            self._deliver_idx = []

    def array(self, a):
        """A pool-backed copy of numpy array ``a``, filled later in this batch."""
        if not isinstance(a, cnp.ndarray):
            raise TypeError(f"CopyPlan.array needs a numpy.ndarray, got {type(a).__name__}")
        return self._copy_array(a)

    cdef object _leaf(self, object obj, int kind, object handler, Py_ssize_t index):
        if kind == K_PASS:
            return obj
        if self.device is not None:
            self._deliver_idx.append(index)
        if kind == K_LEAF:
            if handler[2] is not None:
                self.closers.add(handler[2])
            return handler[0](obj, self)
        return self._copy_array(obj)

    cdef object _copy_array(self, object obj):
        cdef cnp.ndarray a = <cnp.ndarray>obj
        cdef size_t nbytes = <size_t>cnp.PyArray_NBYTES(a)
        cdef pf_block *blk
        cdef _Block base
        if type(a) is not cnp.ndarray or a.descr.flags & NPY_ITEM_REFCOUNT:
            # Subclasses keep their type (and e.g. a mask); object and string
            # dtypes hold references that must be copied one by one, with the
            # GIL. numpy allocates these itself.
            self.nbytes += nbytes
            return np.array(a, copy=True, order="C", subok=True)
        if self._pool == NULL:
            raise _Closing()
        blk = pf_pool_get(self._pool, nbytes)
        if blk == NULL:
            raise MemoryError(
                f"prefetch: cannot allocate {nbytes} bytes to copy an array of shape "
                f"{obj.shape} and dtype {obj.dtype}")
        base = _Block.__new__(_Block)
        base.blk = blk
        descr = cnp.PyArray_DESCR(a)
        Py_INCREF_Descr(descr)
        out = PyArray_NewFromDescr(np.ndarray, descr, cnp.PyArray_NDIM(a), cnp.PyArray_DIMS(a),
                                   NULL, blk.data, cnp.NPY_ARRAY_CARRAY, None)
        cnp.set_array_base(<cnp.ndarray>out, base)
        if cnp.PyArray_IS_C_CONTIGUOUS(a):
            if nbytes:
                self._add_job(blk.data, cnp.PyArray_DATA(a), nbytes)
                # An adapter may pass a temporary view: keep it (and what it
                # keeps alive) until the memcpy has read it.
                self._sources.append(a)
        else:
            self._strided.append((out, a))
        self.nbytes += nbytes
        return out

    cdef void _add_job(self, void *dst, const void *src, size_t nbytes) except *:
        cdef pf_copy_job *grown
        if self._njobs == self._jobs_cap:
            grown = <pf_copy_job *>realloc(self._jobs, (2 * self._jobs_cap + 8) * sizeof(pf_copy_job))
            if grown == NULL:
                raise MemoryError("prefetch: cannot grow the copy plan")
            self._jobs = grown
            self._jobs_cap = 2 * self._jobs_cap + 8
        self._jobs[self._njobs].dst = dst
        self._jobs[self._njobs].src = src
        self._jobs[self._njobs].nbytes = nbytes
        self._njobs += 1

    cdef void _run(self, pf_copier *copier) except *:
        """Every queued copy; returns when all bytes are in place."""
        if self.nbytes >= NOGIL_MIN_BYTES:
            with nogil:
                pf_copy_run(copier, self._jobs, self._njobs)
        elif self._njobs:
            pf_copy_run(copier, self._jobs, self._njobs)
        for out, src in self._strided:
            # numpy releases the GIL itself for large strided copies.
            cnp.PyArray_CopyInto(<cnp.ndarray>out, <cnp.ndarray>src)
        self._strided = []
        self._sources = []


cdef pf_block *take_block(CopyPlan plan, size_t nbytes) except NULL:
    cdef pf_block *blk
    if plan._pool == NULL:
        raise _Closing()
    blk = pf_pool_get(plan._pool, nbytes)
    if blk == NULL:
        raise MemoryError(f"prefetch: cannot allocate {nbytes} bytes for an array")
    plan.nbytes += nbytes
    return blk


cdef void put_block(pf_block *blk) noexcept nogil:
    pf_pool_put(blk)
