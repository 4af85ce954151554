# _sole.pxi (included by _core.pyx): the hand-over proof (SPEC §3 rule 1).
#
# Before a batch is walked, find() marks the leaves that nothing but the
# copying thread can reach: those may be handed out without a copy. It reads
# reference counts through borrowed pointers and runs no Python code while it
# does, so nothing can change a count under it. When in doubt: not sole.
# One thread at a time, with the GIL: the thread that copies the batch.

from cpython.object cimport PyObject, PyTypeObject


cdef extern from "Python.h":
    PyTypeObject PyTuple_Type
    PyTypeObject PyList_Type
    PyTypeObject PyDict_Type
    PyTypeObject *pf_type "Py_TYPE"(PyObject *o)
    # On borrowed pointers, without the reference a cast to object would take.
    bint pf_long_exact "PyLong_CheckExact"(PyObject *o)
    bint pf_float_exact "PyFloat_CheckExact"(PyObject *o)
    bint pf_str_exact "PyUnicode_CheckExact"(PyObject *o)
    bint pf_bytes_exact "PyBytes_CheckExact"(PyObject *o)
    # An exact tuple's or list's items (the macros look at which it is).
    Py_ssize_t pf_seq_size "PySequence_Fast_GET_SIZE"(PyObject *o)
    PyObject *pf_seq_item "PySequence_Fast_GET_ITEM"(PyObject *o, Py_ssize_t i)
    int pf_dict_next "PyDict_Next"(PyObject *o, Py_ssize_t *pos, PyObject **key, PyObject **value)


cdef extern from *:
    """
    /* True when o has exactly one reference. On a free-threaded build the
     * reference count alone proves nothing (other threads may hold unmerged
     * references): there only the interpreter's own check is trusted, and
     * without one (3.13t) nothing is ever proven sole. */
    static inline int pf_sole_ref(PyObject *o) {
    #if defined(Py_GIL_DISABLED)
    #  if PY_VERSION_HEX >= 0x030E0000
        return PyUnstable_Object_IsUniquelyReferenced(o);
    #  else
        (void)o;
        return 0;
    #  endif
    #else
        return Py_REFCNT(o) == 1;
    #endif
    }

    /* An exact ndarray whose memory only this object can reach: numpy allocated
     * it for this array (OWNDATA, no base, a memory handler: not memory a C
     * extension wrapped and may still write), in the layout a copy would have
     * (C-contiguous, aligned, writeable), holding no references (not an object
     * or string dtype), no weak reference, and it never exported a buffer
     * (numpy caches the buffer format on the first export; a live export
     * would also show in the reference count). The reference count is the
     * caller's test. numpy's temporary elision (temp_elide.c) asks the same
     * of an operand it overwrites, minus the layout. */
    static inline int pf_array_plain(PyObject *o) {
        PyArrayObject *a = (PyArrayObject *)o;
        PyArrayObject_fields *f = (PyArrayObject_fields *)o;
        int need = NPY_ARRAY_OWNDATA | NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE;
        return Py_TYPE(o) == &PyArray_Type
            && (PyArray_FLAGS(a) & need) == need
            && !(PyArray_FLAGS(a) & NPY_ARRAY_WRITEBACKIFCOPY)
            && f->base == NULL
            && f->weakreflist == NULL
            && f->_buffer_info == NULL
            && f->mem_handler != NULL
            && !(PyDataType_FLAGS(PyArray_DESCR(a)) & NPY_ITEM_REFCOUNT);
    }
    """
    bint pf_sole_ref(PyObject *o)
    bint pf_array_plain(PyObject *o)


@cython.final
cdef class _SoleProof:
    """The leaves of one batch proven to be held by the batch alone."""

    def __dealloc__(self):
        free(self._todo)
        free(self._found)

    cdef void clear(self):
        self.sole = None

    cdef bint holds(self, object obj):
        """``obj`` was proven sole by the last find()."""
        return bool(self.sole) and (<Py_ssize_t><PyObject *>obj) in self.sole

    cdef void find(self, PyObject *root) except *:
        """Mark the leaves of ``root`` that only the copying thread can reach.

        ``root`` is the object next(source) returned, held by the fetch
        thread's one reference alone when nothing else holds it. A node is
        sole when its one reference is its parent's and its parent is sole:
        then no one but the copying thread reaches it. Only exact tuples,
        lists and dicts are looked into (their items are plain C arrays; a
        subclass or any other container may hold its children elsewhere or
        run code to produce them), with borrowed pointers and no Python
        code, so nothing can change a count while they are read. A node
        listed twice, kept by the source, viewed, weakly referenced or
        exported has more references and is not sole, nor is anything under
        it. The walk then hands over a sole plain numpy array
        (pf_array_plain) or a sole registered leaf whose adapter's
        exclusive() says its memory is its own.
        """
        cdef PyObject *o
        cdef PyObject *key
        cdef PyObject *value
        cdef PyTypeObject *t
        cdef Py_ssize_t i, n, pos, ntodo = 0, nfound = 0
        if not pf_sole_ref(root):
            return
        _push(&self._todo, &self._todo_cap, &ntodo, root)
        while ntodo:
            ntodo -= 1
            o = self._todo[ntodo]
            t = pf_type(o)
            if t == &PyTuple_Type or t == &PyList_Type:
                n = pf_seq_size(o)
                for i in range(n):
                    value = pf_seq_item(o, i)
                    if pf_sole_ref(value):
                        _push(&self._todo, &self._todo_cap, &ntodo, value)
            elif t == &PyDict_Type:
                pos = 0
                while pf_dict_next(o, &pos, &key, &value):
                    if pf_sole_ref(value):
                        _push(&self._todo, &self._todo_cap, &ntodo, value)
            elif pf_array_plain(o) or not (
                    pf_is_array(o) or o == <PyObject *>None or pf_long_exact(o)
                    or pf_float_exact(o) or pf_str_exact(o) or pf_bytes_exact(o)):
                # A plain array, or a leaf its adapter may prove exclusive.
                _push(&self._found, &self._found_cap, &nfound, o)
        # Python objects only now, after the last borrowed pointer was read
        # (allocating may run the cyclic GC, and with it any finalizer).
        if nfound:
            self.sole = set()
        for i in range(nfound):
            self.sole.add(<Py_ssize_t>self._found[i])


cdef void _push(PyObject ***stack, Py_ssize_t *cap, Py_ssize_t *n, PyObject *o) except *:
    """Appends a borrowed pointer to a growable C array."""
    cdef PyObject **grown
    cdef Py_ssize_t new_cap
    if n[0] == cap[0]:
        new_cap = 2 * cap[0] + 16
        grown = <PyObject **>realloc(stack[0], new_cap * sizeof(PyObject *))
        if grown == NULL:
            raise MemoryError("prefetch: cannot grow the hand-over check")
        stack[0] = grown
        cap[0] = new_cap
    stack[0][n[0]] = o
    n[0] += 1
