# _tune.pxi (included by _core.pyx): workers="auto" for a map stage.
#
# After each batch the publisher takes, the stage asks its _Tuner how many
# threads to run. The batches are measured in windows (>= 3 batches and
# >= 50 ms). While the publisher waited for the threads and the process leaves
# CPUs idle, a trial doubles the threads; it is kept only on a >= 5 %
# measured gain, else the count goes back and no trial goes above it for 50
# windows (a GIL-bound dataset, or CPUs already full). `reason` says why the
# count stopped growing (stats().tune_reason); a failed trial asks the gauge
# (_gauge.pxi) whether its threads took turns on the GIL. Publisher thread only.

@cython.final
cdef class _Tuner:
    cdef int max_threads           # the most threads a trial may reach
    cdef double cpus               # CPUs the process may use
    cdef int ceiling               # no trial above this (lowered by a failed trial)
    cdef int retry                 # windows until the ceiling is lifted again
    cdef int trial_from            # the count before the trial running, or 0
    cdef double trial_rate         # samples/s before the trial
    cdef int64_t t0                # the window's start; 0: the next batch starts one
    cdef int64_t wait0             # the publisher's wait at the window's start
    cdef double cpu0               # process CPU time at the window's start
    cdef uint64_t samples0
    cdef Py_ssize_t batches        # batches in the window
    cdef str reason                # why the count is not growing now ("" before the first window)

    def __cinit__(self, int max_threads, double cpus):
        self.max_threads = max_threads
        self.ceiling = max_threads
        self.cpus = cpus
        self.reason = ""

    cdef void restart(self):
        """A new epoch: its first batch starts a window."""
        self.t0 = 0

    cdef bint due(self, int64_t now):
        """The batch being taken closes a window (the gauge closes its own first)."""
        return self.t0 != 0 and self.batches + 1 >= 3 and now - self.t0 >= 50 * 1000 * 1000

    cdef int after_batch(self, int threads, uint64_t samples, int64_t wait_ns, _Gauge gauge) except -1:
        """The thread count from now on, given the count ``threads``, the
        samples finished and the publisher's total wait for them so far;
        ``gauge`` judges a failed trial."""
        cdef int64_t now = pf_now_ns(), elapsed
        cdef double rate, waited, busy
        if self.t0 == 0:
            self._new_window(now, samples, wait_ns)
            return threads
        self.batches += 1
        elapsed = now - self.t0
        if self.batches < 3 or elapsed < 50 * 1000 * 1000:
            return threads
        rate = (samples - self.samples0) / (elapsed / 1e9)
        waited = (wait_ns - self.wait0) / <double>elapsed
        busy = (time.process_time() - self.cpu0) / (elapsed / 1e9)
        self._new_window(now, samples, wait_ns)
        if self.trial_from:
            threads_before, self.trial_from = self.trial_from, 0
            if rate < 1.05 * self.trial_rate:
                self.ceiling = threads_before
                self.retry = 50
                serialized = gauge.trial_failed(threads, threads_before, rate / self.trial_rate)
                self.reason = "serialized" if serialized else "no gain"
                return threads_before
            self.reason = "growing"
            return threads
        if self.retry:
            self.retry -= 1
            if not self.retry:
                self.ceiling = self.max_threads
        if waited > 0.1 and threads < self.ceiling and busy < self.cpus - 0.25:
            self.trial_from = threads
            self.trial_rate = rate
            self.reason = "growing"
            return min(self.ceiling, 2 * threads)
        if waited <= 0.1:
            self.reason = "consumer-bound"
        elif busy >= self.cpus - 0.25:
            self.reason = "cpus busy"
        elif threads >= self.max_threads:
            self.reason = "thread limit"
        # else: the last trial's reason, until its ceiling is lifted
        return threads

    cdef void _new_window(self, int64_t now, uint64_t samples, int64_t wait_ns) except *:
        self.t0 = now
        self.batches = 0
        self.samples0 = samples
        self.wait0 = wait_ns
        self.cpu0 = time.process_time()
