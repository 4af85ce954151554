# _stage.pxi (included by _core.pyx): the interface between a stage, which
# produces batches, and the _Core, which publishes them.
#
# The _Core's publisher thread asks its stage for the next batch as parts
# (_Parts: the tree's nodes, its leaves, already memory only the prefetcher
# holds, which of them go to the device, and their bytes), delivers the
# device leaves, rebuilds the batch once and publishes it to the ring. The
# answer is a code, not an exception: a batch, the end, a failure (the error
# in stage.failure, its note added; it ends the stream, or, for one batch's
# error under a map stage's continue policy, takes that batch's place) or
# stopped (close()). Two stages
# implement it: the fetch stage (_fetch.pxi) and the map stage (_map.pxi).
# Threads: produce() runs on the publisher thread; taken() and before_take()
# on the consumer; stop() and doing() on any thread; all with the GIL held.
#
# Also here, written once for both stages: the close-with-grace that joins
# threads and warns about the ones still busy.

cdef enum Produced:
    P_BATCH        # parts filled
    P_END          # the stream ended
    P_FAILED       # stage.failure holds the error; the stream ends with it
    P_BATCH_FAILED # stage.failure holds one batch's error; the stream goes on after it
    P_STOPPED      # close() stopped the stage: nothing more is published


cdef class _Parts:
    """One batch on its way from a stage to the publisher, in the ring slot
    reserved for it; cleared once published."""

    cdef bint room(self, uint64_t nbytes) except -1:
        """Wait for a free slot with room for ``nbytes`` more under max_bytes (a
        batch always fits an empty ring); False once the ring is closed. A
        stage calls it before it makes a batch of ``nbytes``, so that the
        batch being made is never held on top of a full ring."""
        cdef int rc = pf_ring_reserve(self.ring, nbytes, 0, &self.slot)
        cdef int64_t t0
        if rc == PF_EAGAIN:
            t0 = pf_now_ns()
            rc = PF_ETIMEDOUT
            while rc == PF_ETIMEDOUT:   # the GIL is taken between slices
                with nogil:
                    rc = pf_ring_reserve(self.ring, nbytes, WAIT_SLICE_NS, &self.slot)
            self.wait_ns += pf_now_ns() - t0
        if rc == PF_ECLOSED:
            return False
        _check_ring(rc, "waiting for room")
        return True

    cdef void clear(self):
        self.nodes = None
        self.leaves = None
        self.deliver = None
        self.nbytes = 0


cdef class _Stage:
    """What a stage offers its publisher (the _Core). A stage overrides
    produce() and device(), and has the three Python methods the _Core calls:
    stop() (close(): stop waiting; a produce() running returns P_STOPPED),
    doing() (what it is busy with, for a TimeoutError) and counts() (its
    fields of Stats). The other methods do nothing unless it needs them.
    Anything produce() raises is that batch's error (the publisher notes it
    and ends the stream with it)."""

    cdef int produce(self, _Parts parts) except -1:
        """The next batch in ``parts`` (P_BATCH), or P_END, P_FAILED, P_BATCH_FAILED, P_STOPPED."""
        raise NotImplementedError

    cdef void taken(self, uint64_t nbytes):
        """The consumer took a batch of ``nbytes`` from the ring (consumer thread)."""

    cdef int before_take(self) except -1:
        """The consumer is about to take a batch (consumer thread): a stage
        may warn here, at the user's line, with nothing taken yet."""
        return 0

    cdef bint on_own_thread(self):
        """True on a thread of this stage: a next() there would wait for itself."""
        return False

    cdef object device(self):
        """The device Delivery its batches go to, or None (publisher thread)."""
        return None

    def finish(self):
        """The publisher thread ends (on that thread): release what it used."""


def _join_or_warn(threads, double grace, str owner, doing, at=None, double waited=-1):
    """Join ``threads`` (all within ``grace`` s), except the calling one, and
    warn about each still running, which stays a daemon thread: ``owner``
    names the prefetcher or loader, ``doing(thread)`` what the thread is
    stuck in, ``waited`` the seconds it was given in all (``grace`` unless
    given: a close that spent some of it before). The warning points at
    ``at`` (filename, line), else at the user's line."""
    cdef int64_t deadline = pf_now_ns() + <int64_t>(grace * 1e9)
    if waited < 0:
        waited = grace
    me = threading.current_thread()
    stuck = []
    for t in threads:
        if t is not None and t is not me:
            try:
                t.join(max(0.0, (deadline - pf_now_ns()) / 1e9))
            except RuntimeError:
                continue   # its start() was cut short before it ran: nothing to join
            if t.is_alive():
                stuck.append(t)
    for t in stuck:
        _warn.warn(f"{owner}: thread {t.name!r} is still {doing(t)} after {seconds(waited)}; it is left "
                   f"as a daemon thread and exits when that returns", RuntimeWarning, at)
