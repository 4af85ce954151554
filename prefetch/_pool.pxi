# _pool.pxi (included by _core.pyx): pooled memory as numpy arrays.
#
# _Pool owns one csrc/pf_pool.c pool; a Prefetcher's or Loader's epochs share
# it, so a new epoch reuses the blocks the last one warmed (no first-touch page
# faults per epoch). _pooled_array hands out an array over one block, whose
# base (_Block) puts the block back when the last view of it is collected.
# Threads: _pooled_array from any thread holding the GIL (pf_pool_get locks);
# blocks come back from any thread.

cdef class _Block:
    def __dealloc__(self):
        if self.blk != NULL:
            pf_pool_put(self.blk)


@cython.final
cdef class _Pool:
    """One pool of blocks, closed once by its owner; blocks still out free
    themselves when they come back."""

    def __cinit__(self):
        self.p = pf_pool_new(0)
        if self.p == NULL:
            raise MemoryError("prefetch: cannot allocate the buffer pool")
        self._epoch = pf_fork_epoch()

    def __dealloc__(self):
        if self.p != NULL and self._epoch == pf_fork_epoch():
            pf_pool_close(self.p)

    def close(self):
        if self.p != NULL:
            self._final = pf_pool_get_stats(self.p)
            if self._epoch == pf_fork_epoch():   # in a forked child: the parent's lock may be held
                pf_pool_close(self.p)
            self.p = NULL

    cdef void keep_for(self, size_t batches, size_t nbytes):
        """Keep free blocks for ``batches`` batches of up to ``nbytes`` (the
        largest so far), twice over: blocks are binned by size class, so mixed
        sizes need more. With 1x, bench/soak.py (4 shapes, 3 batches held)
        re-allocated 1.3 % of blocks for ever; with 2x, 3 blocks in 21,730
        batches. A dropped hoard is still freed."""
        if nbytes > self.largest and self.p != NULL:
            self.largest = nbytes
            pf_pool_set_keep(self.p, 2 * batches * nbytes)

    cdef pf_pool_stats stats(self):
        return pf_pool_get_stats(self.p) if self.p != NULL else self._final


cdef object _pooled_array(pf_pool *pool, cnp.PyArray_Descr *descr, int nd, cnp.npy_intp *dims,
                          size_t nbytes):
    """A new C-contiguous array over a block of ``pool``: ``nd`` dims, ``descr``
    (borrowed), uninitialised."""
    cdef pf_block *blk
    cdef _Block base
    if pool == NULL:
        raise _Closing()
    blk = pf_pool_get(pool, nbytes)
    if blk == NULL:
        raise MemoryError(f"prefetch: cannot allocate {nbytes} bytes for an array "
                          f"of dtype {<object>descr}")
    base = _Block.__new__(_Block)
    base.blk = blk
    Py_INCREF_Descr(descr)   # PyArray_NewFromDescr steals it
    out = PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, NULL, blk.data, cnp.NPY_ARRAY_CARRAY, None)
    cnp.set_array_base(<cnp.ndarray>out, base)
    return out
