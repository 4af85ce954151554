# _assemble.pxi (included by _core.pyx): what a map stage makes of each
# sample, one class per batching mode, on the loader threads that loaded them.
#
# The stage asks its assembly for a new batch (new_batch), gives it each
# loaded sample (take_sample) and each failed row (fail), tells it when the
# last row is done (finish), and takes the finished batch's parts for the
# publisher (hand). An assembly owns its per-batch state (a _Batch of its
# own kind) and never calls the stage; take_sample and finish return the
# batch's bytes once its size is known, for the stage's max_bytes count.
#   _StackAssembly (_stack.pxi)   the default collate: rows of pooled blocks
#   _OwningAssembly               no batching: the sample (or collate(sample)) is the batch
#   _CustomAssembly               collate=f, on the thread of the last row (an _OwningAssembly)
# Whatever a thread hands on is copied (or proven sole) before that thread
# loads again: a dataset may refill one buffer per thread. Loader threads
# only, but hand() (the publisher); GIL held.


def assembly(int mode, collate, _Pool pool, delivery, name):
    """The assembly of a batching mode (a MapMode: the one place that reads
    it); it holds the loader's device ``delivery`` and closes it."""
    return {M_STACK: _StackAssembly, M_CUSTOM: _CustomAssembly, M_SINGLE: _OwningAssembly}[mode](
        pool, name, collate, delivery)


cdef class _Batch:
    """One batch being assembled from its samples; each mode's assembly adds its own fields."""

    def __cinit__(self, Py_ssize_t k, list keys, unsigned long gen):
        self.k = k
        self.keys = keys
        self.n = len(keys)
        self.gen = gen
        self.worker = -1


cdef class _Assembly:
    """What every mode's assembly offers its stage, and the pool's keep policy."""

    def __cinit__(self, _Pool pool, name, collate, delivery):
        self.pool = pool
        self.name = name
        self.delivery = delivery
        self.closers = set()

    cdef _Batch new_batch(self, Py_ssize_t k, list keys, unsigned long gen):
        raise NotImplementedError

    cdef int64_t take_sample(self, _Batch b, Py_ssize_t row, object sample, _ThreadContext t) except -2:
        """Row ``row``'s ``sample``, on the thread ``t`` that loaded it: ``b``'s bytes
        once its size is known (a layout made, a copy made), else -1."""
        raise NotImplementedError

    cdef int64_t finish(self, _Batch b, _ThreadContext t) except -2:
        """The last row of ``b`` is done (on that row's thread ``t``): as take_sample."""
        return -1

    cdef void hand(self, _Batch b, _Parts parts) except *:
        """``b``'s parts for the publisher (publisher thread)."""
        raise NotImplementedError

    cdef void new_epoch(self):
        """An epoch begins: its counters start again."""

    def close(self):
        """Once the threads are stopped: the adapters' close hooks of what was
        copied and the device delivery's, each once (one that is both runs once)."""
        if self.delivery is not None:
            self.closers.add(self.delivery.close)
        while self.closers:
            self.closers.pop()()   # popped first: run once, even if interrupted

    cdef void fail(self, _Batch b, Py_ssize_t row, int wid, exc, str what) except *:
        """Row ``row`` of ``b`` failed with ``exc`` (its note added): the batch
        fails with the error of its lowest failed row."""
        key = b.keys[row]
        exc = _stop_as_error(exc, f"{what} sample {key!r}")
        _note_batch(exc, f"in loader thread {self.name}-w{wid}", f"{what} sample {key!r}, row {row + 1} of {{batch}}",
                    b.k + 1)
        if b.failure is None or row < b.fail_row:
            b.failure = exc
            b.fail_row = row


cdef class _OwnedBatch(_Batch):
    """A batch made of one object its thread copied: a sample, or a collate result."""


cdef class _OwningAssembly(_Assembly):
    """No batching: each sample (or collate(sample)) is a batch, copied at
    once; and what collate=f shares with it: the thread copies what it hands on."""

    def __cinit__(self, _Pool pool, name, collate, delivery):
        self.collate = collate
        self.new_epoch()

    cdef _Batch new_batch(self, Py_ssize_t k, list keys, unsigned long gen):
        return _OwnedBatch.__new__(_OwnedBatch, k, keys, gen)

    cdef int64_t take_sample(self, _Batch b, Py_ssize_t row, object sample, _ThreadContext t) except -2:
        if self.collate is None:
            return self._own(sample, <_OwnedBatch>b, t)   # borrowed: the thread's variable is its reference
        result = self.collate(sample)
        return self._own(result, <_OwnedBatch>b, t)

    cdef void hand(self, _Batch batch, _Parts parts) except *:
        cdef _OwnedBatch b = <_OwnedBatch>batch
        own = b.parts
        b.parts = None
        parts.nodes, parts.leaves, parts.deliver, parts.nbytes = own.nodes, own.leaves, own.deliver, own.nbytes
        # Its copy counts for the epoch it is taken in, as the core's counters.
        self.copied = [x + y for x, y in zip(self.copied, b.copied)]

    cdef void new_epoch(self):
        self.copied = [0, 0, 0, 0]

    def counts(self):
        return dict(zip(_COPY_FIGURES, self.copied), bytes_collated=0)

    cdef int64_t _own(self, object item, _OwnedBatch b, _ThreadContext t) except -2:
        """``item`` (a sample with no batching, or a collate result) copied, or
        handed over where only it holds its memory, into ``b.parts``, on the
        loader thread that made it, before that thread loads again; counted
        in stats once taken. Returns the batch's bytes. ``item`` is borrowed:
        the caller's variable is its one reference when the dataset (or
        collate) kept none."""
        cdef _BatchCopy copy = t.batch_copy(self.pool, self.delivery)
        cdef CopyPlan plan = copy.plan
        cdef _Parts parts = _Parts.__new__(_Parts)
        cdef uint64_t copied
        plan._pool = self.pool.p   # read now: NULL once the loader closed (_Closing)
        if plan._pool == NULL:
            raise _Closing()
        copy.copy(item, parts)
        b.parts = parts
        copied = plan.nbytes - plan.handed_bytes   # adapters add to nbytes what they copy
        b.copied = (copied, plan.handed_bytes, plan.copied_leaves, plan.handed_leaves)
        if plan.closers:
            self.closers |= plan.closers
        self.pool.keep_for(self.keep_batches, copied)   # a steady state allocates nothing
        return parts.nbytes


@cython.final
cdef class _CustomAssembly(_OwningAssembly):
    """collate=f: the samples are kept; f runs on the thread of the last row."""

    cdef _Batch new_batch(self, Py_ssize_t k, list keys, unsigned long gen):
        b = _OwnedBatch.__new__(_OwnedBatch, k, keys, gen)
        (<_OwnedBatch>b).samples = [None] * len(keys)
        return b

    cdef int64_t take_sample(self, _Batch b, Py_ssize_t row, object sample, _ThreadContext t) except -2:
        (<_OwnedBatch>b).samples[row] = sample
        return -1

    cdef int64_t finish(self, _Batch batch, _ThreadContext t) except -2:
        """collate=f runs here, and its result is copied before the thread
        loads again: the batch's bytes (-1 where it failed)."""
        cdef _OwnedBatch b = <_OwnedBatch>batch
        cdef int64_t nbytes = -1
        if b.failure is not None:
            return -1
        samples, b.samples = b.samples, None
        result = None
        try:
            result = self.collate(samples)
        except BaseException as exc:
            failure = _stop_as_error(exc, "the collate function")
            _note_batch(failure, f"by the collate function of loader {self.name!r}", "collating {batch}", b.k + 1)
            b.failure = failure
            failure = None
        samples = None   # the result is then its only holder when collate built it afresh
        if b.failure is None:
            try:
                nbytes = self._own(result, b, t)   # before this thread loads again
            except BaseException as exc:
                _note_batch(exc, f"in a thread of loader {self.name!r}", "copying the collate result of {batch}",
                            b.k + 1)
                b.failure = exc
        result = None
        return nbytes


cdef object _stop_as_error(object exc, str doing):
    """``exc``, or for a StopIteration a RuntimeError caused by it: escaping
    dataset[i], fn or collate, it would reach the consumer through next() and
    end its loop silently, so it is an error, as PEP 479
    makes it inside a generator."""
    if not isinstance(exc, StopIteration):
        return exc
    err = RuntimeError(f"{doing} raised StopIteration (inside a loader thread that is an error, "
                       "not the end of the data)")
    err.__cause__ = exc
    return err

