# _batchcopy.pxi (included by _core.pyx): a batch from a source made the
# prefetcher's own: walk (_tree.pxi) -> CopyPlan (_copy.pxi) -> memcpy jobs
# split across the copy threads (csrc/pf_copy.c) -> _Parts.
#
# It owns the copier, so `workers=` (the threads that copy) belongs here. One
# thread at a time uses a _BatchCopy: a Prefetcher's publisher thread (one
# per epoch, one epoch at a time; the copy threads persist across epochs), or
# one loader thread (its own). Its owner closes it once, after the threads.

# The copy figures of Stats, in this order wherever they travel together.
_COPY_FIGURES = ("bytes_copied", "bytes_handed_over", "leaves_copied", "leaves_handed_over")


@cython.final
cdef class _BatchCopy:

    def __cinit__(self, _Pool pool, int workers, bint handover, delivery, size_t keep_batches):
        self.plan = CopyPlan.__new__(CopyPlan)
        self.plan._pool = pool.p
        self.pool = pool
        self.plan.device = delivery
        self.workers = workers
        self._handover = handover
        self._keep_batches = keep_batches
        self._fork_epoch = pf_fork_epoch()
        _check_rc(pf_copier_init(&self._copier, workers - 1), "the copy threads")
        self._copier_ok = True

    def __dealloc__(self):
        self.fini()

    def fini(self):
        """Stop the helper threads (idempotent; nothing in a forked child,
        where they do not exist and their locks may be held)."""
        if self._copier_ok and pf_fork_epoch() == self._fork_epoch:
            self._copier_ok = False
            with nogil:
                pf_copier_fini(&self._copier)

    def close(self):
        """Once the threads that copy are stopped: the adapters' close hooks
        for what was copied (e.g. an engine sync: the memory behind dropped
        batches is returned) and the device delivery's (a Prefetcher's: its
        one holder), each once (one that is both runs once), then the copy threads."""
        self.plan._pool = NULL   # the pool is going away: a copy still running raises _Closing
        closers = self.plan.closers
        if self.plan.device is not None:
            closers.add(self.plan.device.close)
        while closers:
            closers.pop()()   # popped first: run once, even if interrupted
        self.fini()

    cdef void copy(self, object item, _Parts parts) except *:
        """``item``'s leaves copied (or handed over) into ``parts``. ``item`` is
        borrowed: the caller's variable is its one reference when the source
        kept none, which is what the hand-over proof counts on."""
        cdef CopyPlan plan = self.plan
        cdef list leaves = []
        cdef uint64_t copied
        plan._reset()
        if self._handover:
            plan._proof.find(<PyObject *>item)
        parts.nodes = _flatten(item, plan, leaves)
        plan._run(&self._copier)
        parts.leaves = leaves
        parts.deliver = plan._deliver_idx
        parts.nbytes = plan.nbytes
        copied = plan.nbytes - plan.handed_bytes   # adapters add to nbytes what they copy
        self.bytes_copied += copied
        self.bytes_handed += plan.handed_bytes
        self.leaves_copied += plan.copied_leaves
        self.leaves_handed += plan.handed_leaves
        if self._keep_batches:   # for the ring, the batch being filled and a few the user holds
            self.pool.keep_for(self._keep_batches, copied)

    cdef void new_epoch(self):
        """The counters count one epoch, as the core's batch counters do."""
        self.bytes_copied = self.bytes_handed = self.leaves_copied = self.leaves_handed = 0

    def counts(self):
        return dict(zip(_COPY_FIGURES, (self.bytes_copied, self.bytes_handed, self.leaves_copied,
                                        self.leaves_handed)), workers=self.workers)
