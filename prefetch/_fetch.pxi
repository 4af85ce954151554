# _fetch.pxi (included by _core.pyx): the fetch stage behind Prefetcher.
#
# next(source) on the publisher thread, one call at a time and in order (an
# iterator is not thread-safe, and many sources refill one buffer); then the
# batch copy (_batchcopy.pxi) makes every leaf the prefetcher's own before
# the next call. A source that forks leaves its child on this thread's stack:
# there the stage stops and touches nothing of the parent's.


@cython.final
cdef class _FetchStage(_Stage):

    def __cinit__(self, source, _BatchCopy batch_copy, name):
        self.source = source
        self.batch_copy = batch_copy
        self.name = name
        self._doing = "starting"
        batch_copy.new_epoch()
        self._fork_epoch = pf_fork_epoch()

    cdef object device(self):
        return self.batch_copy.plan.device

    cdef int produce(self, _Parts parts) except -1:
        cdef uint64_t nbytes = 0
        self._doing = "waiting in next(source)"
        try:
            item = next(self.source)
        except (StopIteration, GeneratorExit):
            return P_END if self._fork_epoch == pf_fork_epoch() else P_STOPPED
        except BaseException as exc:
            if self._fork_epoch != pf_fork_epoch():
                raise   # in a child forked inside the source: its own exception (sys.exit())
            self.failure = _note_batch(exc, "in " + _publisher_name("prefetcher", self.name),
                                       "fetching {batch}", self._fetched + 1, True)
            return P_FAILED
        if self._fork_epoch != pf_fork_epoch():
            # The source forked and this is the child, on the worker's stack:
            # the ring, the pool and the copy helpers belong to the parent's
            # threads (their locks may be held there for ever).
            return P_STOPPED
        if self._stopped:
            return P_STOPPED
        try:
            if parts.max_bytes:
                # Room for its bytes before it is copied, not on top of a full ring;
                # again after, for leaves whose size only their copy told.
                self._doing = "waiting for room under max_bytes"
                nbytes = _tree_nbytes(item)
                if not parts.room(nbytes):
                    return P_STOPPED
            self._doing = "copying"
            self.batch_copy.copy(item, parts)
            if parts.max_bytes and parts.nbytes > nbytes and not parts.room(parts.nbytes):
                return P_STOPPED
        except BaseException as exc:
            if self._stopped:
                return P_STOPPED   # close() took the pool away
            self.failure = _note_batch(exc, "in " + _publisher_name("prefetcher", self.name),
                                       "copying {batch}", self._fetched + 1, True)
            return P_FAILED
        # The source's object goes before the next next(source): a source
        # that refills one buffer may check that it is free.
        item = None
        self._fetched += 1
        return P_BATCH

    def stop(self):
        self._stopped = True

    def finish(self):
        self.source = None   # the source's last batch is not kept alive

    def doing(self):
        return self._doing

    def counts(self):
        return self.batch_copy.counts()
