# _copy.pxi (included by _core.pyx): a batch's copies into pool blocks.
#
# While the tree is walked (the copying thread, GIL held), each array leaf gets a
# pool block and an output array over it, and its memcpy is queued; _run then
# does every queued memcpy without the GIL, split across the copier's helper
# threads. Leaf adapters (prefetch.adapters.register_leaf) receive the
# CopyPlan and call plan.array(a) for the memory they need copied.
#
# Hand-over (SPEC §3 rule 1): before the walk, the plan's _SoleProof
# (_sole.pxi) marks the leaves that nothing but the copying thread can reach;
# those are handed out as they are, every other array leaf is copied. When in
# doubt, copy.
#
# A leaf's own state (an ndarray subclass's attributes, a tensor subclass's
# __dict__) is walked like a batch by copy_state (SPEC §3 rule 1):
# the arrays in it are copied too, not carried over from the source.

from cpython.object cimport PyObject, PyTypeObject


cdef extern from "numpy/arrayobject.h":
    PyTypeObject PyArray_Type
    bint pf_is_array "PyArray_Check"(PyObject *o)
    # dtype flag: the items hold references (object fields, StringDType).
    enum: NPY_ITEM_REFCOUNT
    # Cython's numpy.pxd leaves this one out; it steals a reference to descr.
    # subtype is the C type, as numpy declares it: a PyTypeObject *, not an object
    # (a PyObject * there is an error since GCC 14: -Wincompatible-pointer-types).
    object PyArray_NewFromDescr(PyTypeObject *subtype, cnp.PyArray_Descr *descr, int nd,
                                cnp.npy_intp *dims, cnp.npy_intp *strides, void *data,
                                int flags, object obj)
    void Py_INCREF_Descr "Py_INCREF"(cnp.PyArray_Descr *)


# Below this, releasing the GIL (and waking the other thread that wants it)
# costs more than the memcpy itself; numpy draws the same line.
cdef size_t NOGIL_MIN_BYTES = 1 << 16

# Leaves nested in the state of leaves (an array in an attribute of an array
# in an attribute of ...): each level recurses on the copying thread's C stack.
# Real batches have one or two; past this the batch is almost surely a chain
# built by mistake (SPEC §4: an error, not a crash).
MAX_STATE_NESTING = 1000


cdef class CopyPlan:
    """The copies of the batch being fetched, handed to leaf adapters.

    ``array(a)`` returns a fresh C-contiguous pool-backed array with ``a``'s
    shape and dtype, whose bytes are copied from ``a`` later in this batch,
    without the GIL, before the batch is delivered or published: wrap it, do
    not read it. ``device`` is the prefetcher's device delivery, or None.
    """

    def __cinit__(self):
        self._jobs = NULL
        self._proof = _SoleProof.__new__(_SoleProof)
        self._strided = []
        self._sources = []
        self.closers = set()
        self._copying = {}

    def __dealloc__(self):
        free(self._jobs)

    def __init__(self):
        raise TypeError("CopyPlan objects are made by the prefetcher, not by users")

    cdef void _reset(self):
        self.batches += 1
        self._njobs = 0
        self.nbytes = 0
        self.handed_bytes = 0
        self.copied_leaves = 0
        self.handed_leaves = 0
        self._strided = []
        self._sources = []
        self._proof.clear()
        if self.device is not None:
            self._deliver_idx = []

    def array(self, a):
        """A pool-backed copy of numpy array ``a``, filled later in this batch."""
        if not isinstance(a, cnp.ndarray):
            raise TypeError(f"CopyPlan.array needs a numpy.ndarray, got {type(a).__name__}")
        return self._copy_array(a)

    def copy_state(self, state, source, copy):
        """``state`` walked like a batch, for ``copy``, the new leaf made from ``source``.

        For the state a leaf holds besides its memory (a subclass's
        attributes): its arrays and registered leaves are copied (not
        delivered to ``device``), its containers rebuilt, other objects kept;
        a reference back to ``source`` becomes ``copy``, as in
        ``copy.deepcopy``. Returns the new state: set it on ``copy``.
        """
        key = id(source)
        if len(self._copying) >= MAX_STATE_NESTING:
            raise ValueError(
                f"the batch nests leaves in the attributes of leaves deeper than "
                f"{MAX_STATE_NESTING} levels (a {type(source).__name__} at depth "
                f"{MAX_STATE_NESTING}); a batch must be a tree of at most that many")
        device = self.device
        self._copying[key] = copy
        self.device = None          # _leaf then queues no delivery either
        try:
            leaves = []
            return _unflatten(_flatten(state, self, leaves), leaves)
        finally:
            self.device = device
            del self._copying[key]

    def array_at(self, keep, Py_ssize_t address, shape, cnp.dtype dtype not None):
        """``array`` for memory numpy has no view of: a fresh C-contiguous
        pool-backed array of ``shape`` and ``dtype``, whose bytes are copied
        later in this batch from the C-contiguous memory at ``address``, which
        ``keep`` keeps valid until then. The seam of this package's own
        framework adapters, not of the public adapter API:
        the address is trusted. Where making a numpy view of a framework's
        small array costs more than its copy."""
        cdef cnp.npy_intp dims[64]   # NPY_MAXDIMS of numpy 2
        cdef int i, nd = len(shape)
        cdef size_t nbytes = <size_t>dtype.itemsize
        if nd > 64:
            raise ValueError(f"CopyPlan.array_at: {nd} dimensions, numpy allows 64")
        for i in range(nd):
            dims[i] = shape[i]
            nbytes *= <size_t>dims[i]
        if nbytes and not address:
            raise ValueError("CopyPlan.array_at: no memory at address 0")
        out = _pooled_array(self._pool, <cnp.PyArray_Descr *>dtype, nd, dims, nbytes)
        self.nbytes += nbytes
        if nbytes:
            self._add_job(cnp.PyArray_DATA(<cnp.ndarray>out), <const void *>address, nbytes)
            self._sources.append(keep)
        return out

    cdef object _leaf(self, object obj, int kind, object handler, Py_ssize_t index):
        if kind == K_PASS:
            return obj
        if self._copying:
            done = self._copying.get(id(obj))
            if done is not None:
                return done         # a leaf's state refers back to the leaf (copy_state)
        if self.device is not None:
            self._deliver_idx.append(index)
        if kind == K_LEAF:
            if handler[1] is not None and self._proof.holds(obj) and handler[1](obj) is True:
                return self._hand_over(obj, _leaf_nbytes(obj))
            if handler[2] is not None:
                self.closers.add(handler[2])
            self.copied_leaves += 1
            return handler[0](obj, self)
        if kind == K_ARRAY and self._proof.holds(obj):
            return self._hand_over(obj, <size_t>cnp.PyArray_NBYTES(<cnp.ndarray>obj))
        self.copied_leaves += 1
        return self._copy_array(obj)

    cdef object _hand_over(self, object obj, size_t nbytes):
        self.handed_leaves += 1
        self.handed_bytes += nbytes
        self.nbytes += nbytes
        return obj

    cdef object _copy_array(self, object obj):
        cdef cnp.ndarray a = <cnp.ndarray>obj
        cdef size_t nbytes = <size_t>cnp.PyArray_NBYTES(a)
        if type(a) is not cnp.ndarray or a.descr.flags & NPY_ITEM_REFCOUNT:
            # Subclasses keep their type (and e.g. a mask); object and string
            # dtypes hold references that must be copied one by one, with the
            # GIL. numpy allocates these itself.
            self.nbytes += nbytes
            out = np.array(a, copy=True, order="C", subok=True)
            if type(out) is not cnp.ndarray:
                self._copy_array_state(a, out)
            return out
        out = _pooled_array(self._pool, cnp.PyArray_DESCR(a), cnp.PyArray_NDIM(a),
                            cnp.PyArray_DIMS(a), nbytes)
        if cnp.PyArray_IS_C_CONTIGUOUS(a):
            if nbytes:
                self._add_job(cnp.PyArray_DATA(<cnp.ndarray>out), cnp.PyArray_DATA(a), nbytes)
                # An adapter may pass a temporary view: keep it (and what it
                # keeps alive) until the memcpy has read it.
                self._sources.append(a)
        else:
            self._strided.append((out, a))
        self.nbytes += nbytes
        return out

    cdef void _copy_array_state(self, object a, object out) except *:
        """Replace the attributes of ``out``, a subclass's copy of ``a``, by copies.

        They are what the subclass's ``__array_finalize__`` set for the copy;
        numpy's documented pattern (``self.info = getattr(obj, "info", None)``)
        carries the source's very objects over, so an array among them would
        be shared with the source. What it computed afresh (a memmap's
        ``_mmap = None``) is kept, copied.
        """
        cdef type t = type(out)
        slots = _slot_names(t)
        if slots is None:
            raise TypeError(
                f"prefetch cannot copy {article(t.__module__)}.{t.__qualname__} array: a subclass "
                f"attribute shadows one of its __slots__, so its state cannot be copied by name; "
                f"tell prefetch how with prefetch.register_leaf({t.__qualname__}, copy)")
        values = []
        names, set_slots = _state_of(out, t.__dictoffset__ != 0, slots, values)
        if values:
            _set_state(out, names, set_slots, self.copy_state(values, a, out), 0)

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
        if self.nbytes - self.handed_bytes >= NOGIL_MIN_BYTES:
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


cdef size_t _leaf_nbytes(object leaf):
    """Bytes of a registered leaf handed over, for max_bytes and stats: its
    ``nbytes`` attribute where it has one, else 0."""
    try:
        return max(0, int(getattr(leaf, "nbytes", 0)))
    except Exception:
        return 0


cdef uint64_t _tree_nbytes(object tree) except? 0xFFFFFFFFFFFFFFFF:
    """The bytes a copy of ``tree`` holds, known before it is made: its arrays'
    and its registered leaves' that have ``nbytes`` (others count 0)."""
    cdef list leaves = []
    cdef uint64_t total = 0
    _flatten(tree, None, leaves)
    for leaf in leaves:
        total += <uint64_t>cnp.PyArray_NBYTES(<cnp.ndarray>leaf) if isinstance(leaf, cnp.ndarray) \
            else _leaf_nbytes(leaf)
    return total


def _walk(tree):
    """The batch ``tree`` taken apart and rebuilt, as the publisher does, for
    bench/bench_tree.py (the walk alone cannot be timed through Prefetcher).
    Array leaves need a prefetcher's pool: TypeError here."""
    cdef CopyPlan plan = CopyPlan.__new__(CopyPlan)
    cdef list leaves = []
    plan._reset()
    try:
        return _unflatten(_flatten(tree, plan, leaves), leaves)
    except _Closing:
        raise TypeError("_walk takes batches without array leaves") from None
