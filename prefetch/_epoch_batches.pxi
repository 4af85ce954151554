# _epoch_batches.pxi (included by _core.pyx): one epoch of a map stage as its
# batches open.
#
# An epoch's key lists are read in order (the sampler's, or the loader's own
# order), each opening a batch of that epoch's generation; the batches wait
# in `pending` until the publisher takes them. A map stage holds the current
# epoch's (`now`) and, where the loader gives the order itself (a function
# of the seed and the epoch, read by no user code), the next epoch's
# (`after`): once `now` has no batch left to open, the loader threads open
# `after`'s first batches, within the window and the _Ahead bounds counted
# with `now`'s. The next start_epoch adopts `after` when its order is the
# one planned (its batches, loaded once, are that epoch's first), and drops
# it otherwise, as set_epoch to another epoch, load_state_dict and close do
# at once. Every field is read and written with the GIL held; batches open
# under the stage's _lock, epochs start, end and are dropped under its _cv.

cdef Py_ssize_t NO_STOP = <Py_ssize_t>(INT64_MAX >> 1)
cdef class _MapStage   # _map.pxi


@cython.final
cdef class _EpochBatches:
    cdef object token              # what its order is a function of (the loader's own); None: unknown
    cdef readonly Py_ssize_t epoch # sample_rng()'s and WorkerInfo's
    cdef object keys               # its iterator of key lists; None: none to read
    cdef unsigned long gen         # its batches' generation, never reused
    cdef bint exhausted            # every key list is read
    cdef bint reading              # a thread is inside next(keys)
    cdef Py_ssize_t next_k         # the number of the next batch to open
    cdef Py_ssize_t taken          # batches handed to the publisher
    cdef Py_ssize_t stop_k         # no batch from here on opens (an error came before it)
    cdef dict pending              # k -> _Batch, opened and not taken
    cdef object failure            # an error of the sampler or a worker_init, raised after batch stop_k - 1

    def __cinit__(self, unsigned long gen, Py_ssize_t epoch, token, keys):
        self.gen = gen
        self.epoch = epoch
        self.token = token
        self.keys = keys
        self.stop_k = NO_STOP
        self.pending = {}

    cdef inline bint may_open(self):
        return self.keys is not None and not self.exhausted and self.next_k < self.stop_k

    cdef inline Py_ssize_t open_count(self):
        """Batches opened and not yet taken."""
        return self.next_k - self.taken

    cdef inline void stop_after(self, _Batch b):
        """A row of ``b`` failed: no batch after it opens."""
        self.stop_k = min(self.stop_k, b.k + 1)

    cdef bint adoptable(self, token):
        """It is the epoch ``token`` names, and no thread is reading its keys."""
        return token is not None and self.keys is not None and not self.reading and token == self.token

    cdef open_batch(self, _MapStage st):
        """Reads its next key list and opens that batch, as the one whose rows
        are claimed next (under the stage's _lock). At the end of the key
        lists it is exhausted; an error of the sampler ends the epoch after
        the batches before it, or drops the next epoch, whose key lists are
        read again when it starts (where that error belongs)."""
        cdef _Batch b
        cdef bint failed = False
        k = self.next_k
        self.reading = True
        try:
            keys = list(next(self.keys))
            if not keys:
                raise ValueError(f"the batch sampler yielded an empty batch (batch {k})")
        except StopIteration:
            self.exhausted = True
            self.reading = False
            st._wake_all()
            return
        except BaseException as exc:
            self.reading = False
            if self is st.after:
                st._drop_after()
            elif self is st.now:
                _add_note(exc, f"raised by the sampler of loader {st.name!r} while giving the "
                               f"indices of batch {k + 1} (counted from 1)")
                self.failure = exc
                self.stop_k = min(self.stop_k, k)
            failed = True
        self.reading = False
        if failed:
            st._wake_all()   # once this frame holds the error no more (see _work)
            return
        if self is not st.now and self is not st.after:
            return     # dropped while the sampler ran
        b = _Batch.__new__(_Batch)
        b.k = k
        b.n = len(keys)
        b.gen = self.gen
        b.keys = keys
        if st.mode == M_CUSTOM:
            b.samples = [None] * b.n
        # Counted as big as the largest batch so far until its layout is known.
        b.held = st.ahead.estimate
        st.ahead.held_bytes += b.held
        self.pending[k] = b
        self.next_k = k + 1
        st.cur = b
        st.cur_row = 0

    cdef void drop(self):
        """It ends here: nothing more opens, and its open batches are let go."""
        self.keys = None
        self.pending = {}

    cdef uint64_t held(self):
        """The bytes counted for its open batches."""
        cdef uint64_t total = 0
        for b in self.pending.values():
            total += (<_Batch>b).held
        return total
