# _epoch_batches.pxi (included by _core.pyx): the epochs of a map stage as
# their batches open, and the bounds on what is held ahead of the consumer.
#
# An epoch's key lists are read in order (the sampler's, or the loader's own
# order), each opening a batch of that epoch's generation; the batches wait
# in `pending` until the publisher takes them. _Epochs holds the current
# epoch (`now`) and, where the loader gives the order itself (a function of
# the seed and the epoch, read by no user code), the next one (`after`):
# once `now` has no batch left to open, `after`'s first batches open, within
# the window and the _Ahead bounds counted with `now`'s. The next epoch's
# start adopts `after` when its order is the one planned (its batches, loaded
# once, are that epoch's first), and drops it otherwise, as set_epoch to
# another epoch, load_state_dict and close do at once. _Epochs also knows
# which batch's rows are claimed next (`cur`). None of these knows the stage
# or calls it: the stage (_map.pxi) calls them, under its locks (batches
# open under its _lock, epochs start, end and are dropped under its _cv).

cdef Py_ssize_t NO_STOP = <Py_ssize_t>(INT64_MAX >> 1)


@cython.final
cdef class _EpochBatches:
    """One epoch's key lists and its batches opened and not yet taken."""

    def __cinit__(self, unsigned long gen, Py_ssize_t epoch, token, keys):
        self.gen = gen
        self.epoch = epoch
        self.token = token
        self.keys = keys
        self.stop_k = NO_STOP
        self.pending = {}

    cdef bint may_open(self):
        return (self.keys is not None and not self.exhausted and self.next_k < self.stop_k
                and (self.ended is None or self.next_worker() >= 0))

    cdef Py_ssize_t open_count(self):
        """Batches opened and not yet taken."""
        return self.next_k - self.taken

    cdef void stop_after(self, _Batch b):
        """A row of ``b`` failed: no batch after it opens."""
        self.stop_k = min(self.stop_k, b.k + 1)

    cdef list read_keys(self):
        """Its next key list; None at their end (it is exhausted). An error of
        the sampler is raised as it is. A stream's: [the worker whose slot
        opens next], in turn over those not ended."""
        cdef list keys
        cdef int w
        if self.ended is not None:
            w = self.next_worker()
            if w < 0:
                return None
            self.turn = (w + 1) % len(self.ended)
            return [w]
        self.reading = True
        try:
            keys = list(next(self.keys))
        except StopIteration:
            self.exhausted = True
            return None
        finally:
            self.reading = False
        if not keys:
            raise ValueError(f"the batch sampler yielded an empty batch (batch {self.next_k})")
        return keys

    cdef void add(self, _Batch b):
        """``b``, read by read_keys(), is open."""
        self.pending[b.k] = b
        self.next_k = b.k + 1

    cdef _Batch next_complete(self, bint ordered):
        """The batch to hand out next, if it is complete: the next in order, or
        (ordered=False) the lowest complete one."""
        cdef _Batch b = None
        if ordered:
            found = self.pending.get(self.taken)
            return <_Batch>found if found is not None and (<_Batch>found).complete else None
        for found in self.pending.values():
            # A batch at or past stop_k had rows skipped (an earlier one failed): never handed out.
            if ((<_Batch>found).complete and (<_Batch>found).k < self.stop_k
                    and (b is None or (<_Batch>found).k < b.k)):
                b = <_Batch>found
        return b

    cdef void take(self, _Batch b, bint stop):
        """``b`` is handed out (or, a stream's hole, let go); failed, with ``stop``: none after it is."""
        del self.pending[b.k]
        self.taken += 1
        if stop and b.failure is not None:
            self.stop_k = min(self.stop_k, self.taken)

    cdef bint at_end(self):
        """Every batch it will hand out was handed out."""
        return self.exhausted and not self.pending or self.stop_k <= self.taken

    cdef object take_failure(self):
        """Its error, or None; handed on once and not kept: the stage outlives
        the consumer's frames, which the error's traceback holds."""
        failure, self.failure = self.failure, None
        return failure

    cdef _Batch slot_read(self, _Assembly asm, _Batch slot, int w, list keys, bint ended, part, failure,
                          bint stop):
        """A stream's worker ``w`` read ``slot`` (``ended``: its stream then
        ended): the batch of ``keys``, its rows, takes the slot's place with
        its worker's ``part`` of the state, and is returned; no keys leave a
        hole, with the stream's ``failure`` (``stop``: no batch after it opens)."""
        cdef _Batch b
        if ended:   # no slot of ``w`` opens again; once every worker has, its slots are all open
            self.ended[w] = True
            self.exhausted = all(self.ended)
        if not keys:
            slot.failure = failure
            slot.complete = True
            if failure is not None and stop:
                self.stop_after(slot)
            return None
        b = asm.new_batch(slot.k, keys, slot.gen)
        b.worker, b.part, b.held = w, part, slot.held
        self.pending[slot.k] = b
        return b

    cdef void fail(self, exc, Py_ssize_t k):
        """It ends with ``exc`` after its batches before ``k``."""
        self.failure = exc
        self.stop_k = min(self.stop_k, k)

    cdef void drop(self):
        """It ends here: nothing more opens, and its open batches are let go."""
        self.keys = None
        self.pending = {}

    cdef int next_worker(self):
        """A stream's worker whose slot opens next: in turn over those not
        ended, and with ordered=False, with fewer slots not filled than its
        share of the cap (a framework's per-worker bound then: a worker that is
        slow to fill them does not hold the others back); -1: none."""
        cdef int i, w, n = len(self.ended)
        cdef Py_ssize_t each = 0
        if self.cap:
            each = max(1, self.cap // max(1, n - sum(self.ended)))
        for i in range(n):
            w = (self.turn + i) % n
            if not self.ended[w] and (each == 0 or sum(
                    1 for b in self.pending.values()
                    if (<_Batch>b).worker == w and not (<_Batch>b).complete) < each):
                return w
        return -1

    cdef _Batch slot_of(self, int w):
        """Worker ``w``'s first slot not read yet, or None."""
        cdef _Batch found = None
        for b in self.pending.values():
            if ((<_Batch>b).worker == w and (<_Batch>b).n == 0 and not (<_Batch>b).complete
                    and (found is None or (<_Batch>b).k < found.k)):
                found = <_Batch>b
        return found

    cdef uint64_t held(self):
        """The bytes counted for its open batches."""
        cdef uint64_t total = 0
        for b in self.pending.values():
            total += (<_Batch>b).held
        return total


@cython.final
cdef class _Ahead:
    """What the epochs hold ahead of the consumer, and the bounds on it: bytes
    (max_bytes: of the batches open, and taken but not yet consumed; one batch
    may exceed it alone) and batches (lookahead: opened and not yet consumed).
    A batch is counted as big as the largest so far until its size is known."""

    def __cinit__(self, uint64_t max_bytes):
        self.max_bytes = max_bytes

    cdef void new_epoch(self, uint64_t held):
        """An epoch begins, ``held`` bytes of its batches opened early."""
        self.held_bytes = held
        self.n_consumed = 0

    cdef bint bounded(self):
        return self.max_bytes != 0 or self.lookahead != 0

    cdef bint has_room(self, Py_ssize_t next_k, Py_ssize_t open_now):
        """Batch ``next_k`` may open, ``open_now`` batches being open. Until one
        batch's size is known there is no estimate: one batch opens at a time."""
        if self.lookahead != 0 and next_k - self.n_consumed >= self.lookahead:
            return False
        if self.max_bytes == 0 or self.held_bytes == 0 and open_now == 0:
            return True
        if not self.sized:
            return False
        return self.held_bytes + self.estimate <= self.max_bytes

    cdef void hold(self, _Batch b):
        """``b`` opens: counted at the estimate."""
        b.held = self.estimate
        self.held_bytes += b.held

    cdef void resize(self, _Batch b, uint64_t nbytes, bint counted):
        """``b``'s real size is known: it replaces the estimate (in the count
        where ``counted``: its epoch is not dropped) and raises it."""
        if counted:
            self.release(b.held)
            self.held_bytes += nbytes
        b.held = nbytes
        self.sized = True
        if nbytes > self.estimate:
            self.estimate = nbytes

    cdef void release(self, uint64_t nbytes):
        self.held_bytes -= min(nbytes, self.held_bytes)

    cdef void consumed(self, bint this_epoch, uint64_t nbytes):
        if this_epoch:
            self.n_consumed += 1
        self.release(nbytes)


@cython.final
cdef class _Epochs:
    """The current epoch, the next one opened early, the batch whose rows are
    claimed next, and the window: what opens when. Under the stage's locks."""

    def __cinit__(self, uint64_t max_bytes, Py_ssize_t lookahead):
        self.now = _EpochBatches(0, 0, None, None)
        self.ahead = _Ahead(max_bytes)
        self.ahead.lookahead = max(lookahead, 0)

    cdef unsigned long new_gen(self):
        self.last_gen += 1
        return self.last_gen

    cdef _EpochBatches begin(self, Py_ssize_t epoch, order):
        """Epoch ``epoch`` begins (the current one is dropped): the one opened
        early where ``order`` names it (the loader's own order; None: not
        known ahead), else a new one, whose keys the caller gives once the
        threads run (set_keys)."""
        cdef _EpochBatches e
        self.now.drop()
        e = self.after
        # Opened early as the epoch ``order`` names, and no thread reading its keys:
        if e is not None and order is not None and e.keys is not None and not e.reading and order == e.token:
            self.after = None   # its batches are this epoch's first
        else:
            self.drop_after()
            e = _EpochBatches(self.new_gen(), epoch, order, None)
        self.now = e
        if self.cur is not None and self.cur.gen != e.gen:
            self.cur = None
        self.ahead.new_epoch(e.held())
        return e

    cdef void set_keys(self, _EpochBatches e, batches, following):
        """``e`` (begun) reads ``batches``; ``following``, (order, epoch,
        batches) of the epoch after it where known, opens once ``e`` has no
        batch left to open."""
        if e is not self.now:
            return
        if e.keys is None:
            e.keys = batches
            if type(batches) is tuple:   # a stream's: (its workers, the one whose slot opens first, cap)
                e.ended = [False] * batches[0]
                e.turn = batches[1]
                e.cap = batches[2]
        if following is not None:
            self.after = _EpochBatches(self.new_gen(), following[1], following[0], following[2])

    cdef void drop_after(self):
        """The next epoch is not the one planned: what opened of it is let go."""
        cdef _EpochBatches a = self.after
        if a is None:
            return
        self.after = None
        self.ahead.release(a.held())
        a.drop()
        if self.cur is not None and self.cur.gen == a.gen:
            self.cur = None

    cdef void abandon(self, _EpochBatches e):
        """``e`` ends early: its work is dropped (not the next epoch's)."""
        if e is self.now:
            self.now = _EpochBatches(self.new_gen(), e.epoch, None, None)
            if self.cur is not None and self.cur.gen == e.gen:
                self.cur = None
        e.drop()

    cdef void close(self):
        self.drop_after()
        self.abandon(self.now)

    cdef _EpochBatches epoch_of(self, _Batch b):
        """The epoch ``b`` is of; None once that one is dropped."""
        if b.gen == self.now.gen:
            return self.now
        if self.after is not None and b.gen == self.after.gen:
            return self.after
        return None

    cdef bint has_rows(self):
        """The batch being claimed has a row left, and its epoch runs."""
        return self.cur is not None and self.cur_row < self.cur.n and self.epoch_of(self.cur) is not None

    cdef _Batch claim_row(self, Py_ssize_t *row):
        """The next row of the batch being claimed, or None."""
        if not self.has_rows():
            return None
        row[0] = self.cur_row
        self.cur_row += 1
        return self.cur

    cdef _EpochBatches to_open(self):
        """The epoch whose next batch may open now: the current one, or once
        it has none left to open, the next one, beside it within the window
        and the bounds; None."""
        cdef _EpochBatches e = self.now, a = self.after
        if e.may_open():
            if e.open_count() < self.window and self.ahead.has_room(e.next_k, e.open_count()):
                return e
        elif (e.exhausted and a is not None and a.may_open()
                and e.open_count() + a.next_k < self.window
                and self.ahead.has_room(e.next_k + a.next_k, e.open_count() + a.open_count())):
            return a
        return None

    cdef bint open_next(self, _Assembly asm, name) except -1:
        """Reads the next key list of the epoch that may open a batch and opens
        that batch (``asm`` makes it), as the one whose rows are claimed next:
        True. False where the keys ended or the sampler raised: its error
        ends the current epoch after the batches before it, or drops the
        next epoch, whose key lists are read again when it starts (where that
        error belongs). The stage's _lock is held."""
        cdef _EpochBatches e = self.to_open()
        cdef list keys = None
        cdef _Batch b
        if e is None or self.has_rows():
            return True   # (another thread opened one meanwhile)
        k = e.next_k
        try:
            keys = e.read_keys()
        except BaseException as exc:
            if e is self.after:
                self.drop_after()
            elif e is self.now:
                _note_batch(exc, f"by the sampler of loader {name!r}", "giving the indices of {batch}", k + 1)
                e.fail(exc, k)
            exc = None
        if keys is None or not (e is self.now or e is self.after):   # (dropped while the sampler ran)
            return False
        if e.ended is None:
            b = asm.new_batch(k, keys, e.gen)
        else:   # a slot: its worker's thread reads its rows
            b = _Batch.__new__(_Batch, k, [], e.gen)
            b.worker = keys[0]
        self.ahead.hold(b)
        e.add(b)
        self.cur = b
        self.cur_row = 0
        return True
