# _map.pxi (included by _core.pyx): the map stage behind prefetch.Loader and
# prefetch.map.
#
# Loader threads claim rows in sampler order, call load(key) (dataset[key],
# or fn(item)) concurrently, and collate each sample into its batch's row
# (_collate.pxi) before claiming the next. The _Core's fetch thread takes
# whole batches from the stage through _EpochSource, its source: one ring, one
# consumer side and one lifecycle for Prefetcher and Loader alike.
# Memory is bounded: batches open at most `window` ahead of the last one
# taken. Threads persist across epochs; an epoch is a generation number, and
# work of an older generation is dropped. Every field is read and written
# with the GIL held; `_lock` serialises reading the sampler and laying out a
# batch, `_cv` carries the wake-ups (a batch completed, room in the window, a
# new epoch, close). Every wait is a timed slice that re-checks close().

cdef enum MapMode:
    M_STACK        # the default collate: rows of pooled blocks
    M_CUSTOM       # collate=f: f(samples) on the thread that finished the batch
    M_SINGLE       # no batching (batch_size=None, prefetch.map): the sample is the batch

cdef Py_ssize_t NO_STOP = <Py_ssize_t>(INT64_MAX >> 1)
cdef object _tls = threading.local()   # per loader thread: .info (WorkerInfo), .sample


def sample_rng():
    """A ``numpy.random.Generator`` for the sample being loaded: determined by
    the loader's ``seed``, the epoch and the sample's index alone, whichever
    thread runs it and however many there are.

    Call it inside ``dataset[i]`` (or the function given to ``prefetch.map``);
    anywhere else it raises ``RuntimeError``.
    """
    sample = getattr(_tls, "sample", None)
    if sample is None:
        raise RuntimeError("sample_rng() is called inside dataset[i] (or map's function) while a "
                           "prefetch loader thread runs it; this thread is not loading a sample")
    seed, epoch, key = sample
    if isinstance(key, bool) or not isinstance(key, int) or key < 0:
        raise TypeError(f"sample_rng() needs a non-negative int sample index, got {key!r}")
    # Philox is counter based: one key per (seed), and a counter whose high
    # words are (index, epoch), so no two samples' streams overlap.
    return np.random.Generator(np.random.Philox(key=seed, counter=[0, 0, key, epoch]))


def worker_info():
    """The ``WorkerInfo`` of the loader thread calling it, or None elsewhere."""
    return getattr(_tls, "info", None)


@cython.final
cdef class _Batch:
    cdef Py_ssize_t k              # its number in the epoch, from 0
    cdef Py_ssize_t n              # rows
    cdef Py_ssize_t done           # rows finished (loaded and collated, or failed)
    cdef bint complete             # done == n and the batch is built: the fetch thread may take it
    cdef unsigned long gen
    cdef list keys                 # the sampler's indices, one per row
    cdef list nodes                # M_STACK: the layout, from the first finished sample
    cdef list cols                 # M_STACK: one _Column per leaf
    cdef list samples              # M_CUSTOM: the samples for collate
    cdef object result             # M_CUSTOM, M_SINGLE: what is handed out
    cdef object failure            # the exception of its lowest failed row, or None
    cdef Py_ssize_t fail_row


@cython.final
cdef class _MapStage:
    cdef object load               # key -> sample
    cdef object collate            # M_CUSTOM's f
    cdef int mode
    cdef _Pool pool
    cdef object name
    cdef object worker_init        # worker_id -> None, on each thread before its first sample
    cdef tuple on_thread           # applied on each thread first: the creator's framework modes
    cdef object seed
    cdef bint ordered
    cdef object _lock
    cdef object _cv
    cdef list _threads
    cdef readonly int threads      # threads started
    cdef int target                # threads that claim work; more may be parked (workers="auto")
    cdef Py_ssize_t rows           # rows per batch, for the window
    # workers="auto" (_tune, on the fetch thread): a window of batches is
    # measured; while the fetch thread waits for the threads and CPU is left,
    # a trial doubles the threads, kept only on a measured gain.
    cdef int max_threads           # 0: a fixed count
    cdef int ceiling               # no trial above this (lowered by a failed trial)
    cdef int retry                 # windows until the ceiling is lifted again
    cdef int trial_from            # the count before the trial running, or 0
    cdef double trial_rate
    cdef int64_t tune_t0, tune_wait0, wait_ns
    cdef double tune_cpu0
    cdef uint64_t tune_samples0
    cdef Py_ssize_t tune_batches
    cdef double cpus
    cdef int depth                 # the ring's, for the pool's keep
    cdef size_t max_batch_bytes    # the largest batch's blocks so far
    cdef bint closed
    # the epoch
    cdef unsigned long gen
    cdef Py_ssize_t epoch
    cdef object batches            # iterator of key lists; None between epochs
    cdef bint exhausted
    cdef Py_ssize_t n_keys         # a key must be an int in [0, n_keys); -1: any key
    cdef _Batch cur                # the batch whose rows are being claimed
    cdef Py_ssize_t cur_row
    cdef Py_ssize_t next_k         # the number of the next batch to open
    cdef Py_ssize_t taken          # batches handed to the fetch thread
    cdef Py_ssize_t stop_k         # no batch from here on opens (an error came before it)
    cdef Py_ssize_t window         # batches open ahead of the last one taken
    cdef dict pending              # k -> _Batch, opened and not taken
    cdef object epoch_failure      # an error of the sampler, raised after batch stop_k - 1
    # counters (GIL held)
    cdef int64_t load_ns           # inside load(key), summed over threads
    cdef int64_t idle_ns           # threads waiting for room in the window or a new epoch
    cdef uint64_t samples
    cdef uint64_t bytes_collated
    cdef list busy_since           # per thread: pf_now_ns() when its load began, 0 when idle
    cdef list busy_key

    def __cinit__(self, load, int mode, collate, _Pool pool, name, worker_init, seed, bint ordered,
                  int depth, tuple on_thread=()):
        self.load = load
        self.mode = mode
        self.collate = collate
        self.pool = pool
        self.name = name
        self.worker_init = worker_init
        self.on_thread = on_thread
        self.seed = seed
        self.ordered = ordered
        self.depth = depth
        self._lock = threading.Lock()
        self._cv = threading.Condition(threading.Lock())
        self._threads = []
        self.busy_since = []
        self.busy_key = []
        self.pending = {}
        self.stop_k = NO_STOP
        self.n_keys = -1

    # -- consumer side (the Loader, under the GIL) ---------------------------

    def set_auto(self, int max_threads, double cpus):
        """workers="auto": from one thread up to ``max_threads``, growing while
        that helps and less than ``cpus`` CPUs are busy."""
        self.max_threads = max_threads
        self.ceiling = max_threads
        self.cpus = cpus

    def start_epoch(self, batches, Py_ssize_t epoch, Py_ssize_t n_keys, int threads,
                    Py_ssize_t batch_rows):
        """Begins an epoch over ``batches`` (an iterator of lists of keys) on
        ``threads`` threads (auto: as many as the last epoch ended with); returns
        its generation for _EpochSource."""
        if self.max_threads:
            threads = max(self.target, 1)
            self.tune_t0 = 0   # the first batch of an epoch starts a window
        with self._cv:
            self.gen += 1
            self.epoch = epoch
            self.batches = batches
            self.exhausted = False
            self.n_keys = n_keys
            self.cur = None
            self.cur_row = 0
            self.next_k = 0
            self.taken = 0
            self.stop_k = NO_STOP
            self.pending = {}
            self.epoch_failure = None
            self._set_threads(threads, batch_rows)
            self._cv.notify_all()
        return self.gen

    cdef _set_threads(self, int threads, Py_ssize_t batch_rows):
        # Enough batches open for every thread to have a row, and one more
        # so that a thread finishing a batch finds the next one open.
        self.window = max(2, (threads + batch_rows - 1) // batch_rows + 1)
        self.target = threads
        self.rows = batch_rows
        # Under _cv, as close() sets `closed`: no thread starts after close()
        # listed the threads it joins.
        while self.threads < threads and not self.closed:
            wid = self.threads
            self.busy_since.append(0)
            self.busy_key.append(None)
            t = threading.Thread(target=self._work, args=(wid,), name=f"{self.name}-w{wid}",
                                 daemon=True)
            self._threads.append(t)
            self.threads += 1
            t.start()

    def abandon(self, unsigned long gen):
        """Ends epoch ``gen`` early (its core is closing): work of it is dropped."""
        with self._cv:
            if gen == self.gen:
                self.gen += 1
                self.batches = None
                self.cur = None
                self.pending = {}
            self._cv.notify_all()

    def close(self, double grace=CLOSE_GRACE_S):
        """Stops and joins every thread (at most ``grace`` s in all); idempotent."""
        cdef int64_t deadline
        with self._cv:
            self.closed = True
            self.gen += 1
            self.batches = None
            self.cur = None
            self.pending = {}
            self._cv.notify_all()
        deadline = pf_now_ns() + <int64_t>(grace * 1e9)
        me = threading.current_thread()
        stuck = []
        for t in self._threads:
            if t is not me:
                t.join(max(0.0, (deadline - pf_now_ns()) / 1e9))
                if t.is_alive():
                    stuck.append(t.name)
        self._threads = []
        if stuck:
            _warn.warn(f"loader {self.name!r}: threads {stuck} are still inside the dataset after "
                       f"{grace} s; they are left as daemon threads and exit when it returns",
                       RuntimeWarning)

    def stats(self):
        return dict(workers=self.target, load_s=self.load_ns / 1e9, loader_idle_s=self.idle_ns / 1e9,
                    samples=self.samples, bytes_collated=self.bytes_collated)

    def describe(self):
        """What the threads are doing, for a TimeoutError."""
        cdef int64_t now = pf_now_ns()
        busy = [f"thread {self.name}-w{w} inside load({self.busy_key[w]!r}) for "
                f"{(now - self.busy_since[w]) / 1e9:.1f} s"
                for w in range(self.threads) if self.busy_since[w]]
        return ("waiting for its loader threads: " + ("; ".join(busy) if busy else "none is loading"))

    # -- the fetch thread ----------------------------------------------------

    cdef object next_batch(self, unsigned long gen):
        """The next batch of epoch ``gen`` (in order, or the first complete
        one); StopIteration at its end; _Noted(error) in its place."""
        cdef _Batch b = None
        cdef int64_t t0
        while True:
            if self.closed or gen != self.gen:
                raise _Closing()
            if self.ordered:
                found = self.pending.get(self.taken)
                if found is not None and (<_Batch>found).complete:
                    b = <_Batch>found
            else:
                for found in self.pending.values():
                    if (<_Batch>found).complete and (b is None or (<_Batch>found).k < b.k):
                        b = <_Batch>found
            if b is not None:
                break
            if self.exhausted and not self.pending or self.stop_k <= self.taken:
                if self.epoch_failure is not None:
                    # Raised once, and not kept: the stage outlives the consumer's
                    # frames, which the error's traceback holds (the finalizer's
                    # registry keeps the stage, so a kept error keeps them forever).
                    failure, self.epoch_failure = self.epoch_failure, None
                    raise _Noted(failure)
                raise StopIteration
            t0 = pf_now_ns()
            with self._cv:
                if gen == self.gen and not self.closed:
                    self._cv.wait(WAIT_SLICE_S)
            self.wait_ns += pf_now_ns() - t0
        del self.pending[b.k]
        self.taken += 1
        if self.max_threads:
            self._tune()
        with self._cv:
            self._cv.notify_all()   # room in the window (and parked threads' turn)
        if b.failure is not None:
            self.stop_k = min(self.stop_k, self.taken)
            failure, b.failure = b.failure, None   # not kept: as epoch_failure above
            raise _Noted(failure)
        if self.mode == M_STACK:
            return _unflatten(b.nodes, [(<_Column>c).result() for c in b.cols])
        result = b.result
        b.result = None
        return result

    cdef _tune(self):
        """workers="auto", after each batch taken (fetch thread, GIL held)."""
        cdef int64_t now = pf_now_ns(), elapsed
        cdef double rate, waited, busy
        cdef int grown
        if self.tune_t0 == 0:
            self._new_window(now)
            return
        self.tune_batches += 1
        elapsed = now - self.tune_t0
        if self.tune_batches < 3 or elapsed < 50 * 1000 * 1000:
            return
        rate = (self.samples - self.tune_samples0) / (elapsed / 1e9)
        waited = (self.wait_ns - self.tune_wait0) / <double>elapsed
        busy = (time.process_time() - self.tune_cpu0) / (elapsed / 1e9)
        self._new_window(now)
        if self.trial_from:
            if rate < 1.05 * self.trial_rate:
                # No measured gain: back, and no trial above it for a while
                # (a GIL-bound dataset, or the CPUs were already full).
                self.ceiling = self.trial_from
                self.retry = 50
                self._set_threads(self.trial_from, self.rows)
            self.trial_from = 0
            return
        if self.retry:
            self.retry -= 1
            if not self.retry:
                self.ceiling = self.max_threads
        if waited > 0.1 and self.target < self.ceiling and busy < self.cpus - 0.25:
            self.trial_from = self.target
            self.trial_rate = rate
            grown = min(self.ceiling, 2 * self.target)
            with self._cv:
                self._set_threads(grown, self.rows)

    cdef _new_window(self, int64_t now):
        self.tune_t0 = now
        self.tune_batches = 0
        self.tune_samples0 = self.samples
        self.tune_wait0 = self.wait_ns
        self.tune_cpu0 = time.process_time()

    # -- loader threads ------------------------------------------------------

    def _work(self, int wid):
        cdef _Batch b
        cdef Py_ssize_t row = 0
        cdef int64_t t0
        cdef Py_ssize_t epoch = self.epoch
        cdef CopyPlan plan = CopyPlan.__new__(CopyPlan)
        plan._trusted = True   # the walk only takes samples apart
        _tls.info = WorkerInfo(wid, self.target, self.seed, epoch)
        try:
            failed = False
            try:
                for apply in self.on_thread:
                    apply()
                if self.worker_init is not None:
                    self.worker_init(wid)
            except BaseException as exc:
                self._fail_thread(wid, exc)
                failed = True
            if failed:
                # Woken only now that this frame holds the error no more: the
                # consumer's frames join its traceback once it is raised there.
                self._wake_all()
                return
            while True:
                b = self._claim(wid, &row)
                if b is None:
                    return
                key = b.keys[row]
                if epoch != self.epoch:
                    epoch = self.epoch
                    _tls.info = WorkerInfo(wid, self.target, self.seed, epoch)
                if b.k >= self.stop_k:
                    self._row_done(b)   # an earlier batch failed: this one is never taken
                    continue
                # sample_rng's index: the dataset index, or the item's position for map
                _tls.sample = (self.seed, epoch, key if self.n_keys >= 0 else b.k)
                t0 = pf_now_ns()
                self.busy_since[wid] = t0
                self.busy_key[wid] = key
                sample = None
                try:
                    if self.n_keys >= 0:
                        self._check_key(key)
                    sample = self.load(key)
                except BaseException as exc:
                    self._row_failed(b, row, key, wid, exc, "loading")
                self.load_ns += pf_now_ns() - t0
                self.busy_since[wid] = 0
                _tls.sample = None
                if b.failure is None and b.gen == self.gen:
                    try:
                        self._take_sample(b, row, sample, plan)
                    except BaseException as exc:
                        self._row_failed(b, row, key, wid, exc, "collating")
                sample = None   # before the next load: a dataset may check its buffer is free
                self._row_done(b)
        finally:
            _tls.info = None

    cdef _Batch _claim(self, int wid, Py_ssize_t *row):
        """The batch and row this thread loads next, in sampler order; None once
        closed. A thread numbered past the target count waits (parked)."""
        cdef _Batch b
        cdef int64_t t0
        while True:
            b = self.cur
            if self.closed:
                return None
            if wid >= self.target:
                with self._cv:
                    if not self.closed and wid >= self.target:
                        self._cv.wait(WAIT_SLICE_S)
                continue
            if b is not None and self.cur_row < b.n and b.gen == self.gen:
                row[0] = self.cur_row
                self.cur_row += 1
                return b
            if self._may_open():
                self._open_batch()
                continue
            t0 = pf_now_ns()
            with self._cv:
                if not self.closed and not self._may_open() and (
                        self.cur is None or self.cur_row >= self.cur.n or self.cur.gen != self.gen):
                    self._cv.wait(WAIT_SLICE_S)
            self.idle_ns += pf_now_ns() - t0

    cdef bint _may_open(self):
        return (self.batches is not None and not self.exhausted and self.next_k < self.stop_k
                and self.next_k - self.taken < self.window)

    cdef _open_batch(self):
        cdef _Batch b
        cdef unsigned long gen
        cdef bint failed = False
        with self._lock:   # one thread reads the sampler at a time
            if not self._may_open() or (self.cur is not None and self.cur_row < self.cur.n
                                        and self.cur.gen == self.gen):
                return     # another thread opened one meanwhile
            gen = self.gen
            k = self.next_k
            try:
                keys = list(next(self.batches))
                if not keys:
                    raise ValueError(f"the batch sampler yielded an empty batch (batch {k})")
            except StopIteration:
                if gen == self.gen:
                    self.exhausted = True
                    with self._cv:
                        self._cv.notify_all()
                return
            except BaseException as exc:
                if gen == self.gen:
                    _add_note(exc, f"raised by the sampler of loader {self.name!r} while giving the "
                                   f"indices of batch {k + 1} (counted from 1)")
                    self.epoch_failure = exc
                    self.stop_k = min(self.stop_k, k)
                failed = True
            if failed:
                self._wake_all()   # once this frame holds the error no more (see _work)
                return
            if gen != self.gen:
                return     # the epoch ended while the sampler ran
            b = _Batch.__new__(_Batch)
            b.k = k
            b.n = len(keys)
            b.gen = gen
            b.keys = keys
            if self.mode == M_CUSTOM:
                b.samples = [None] * b.n
            self.pending[k] = b
            self.next_k = k + 1
            self.cur = b
            self.cur_row = 0

    cdef _check_key(self, key):
        if isinstance(key, bool) or not isinstance(key, int):
            try:
                key = operator.index(key)   # a numpy or framework integer
            except TypeError:
                raise TypeError(f"the sampler yielded {key!r} ({type(key).__name__}); a sample index "
                                "must be an int") from None
        if not 0 <= key < self.n_keys:
            raise IndexError(f"the sampler yielded index {key}, out of range for a dataset of "
                             f"length {self.n_keys}")

    cdef _take_sample(self, _Batch b, Py_ssize_t row, object sample, CopyPlan plan):
        cdef list leaves
        cdef Py_ssize_t at
        cdef bint first = False, flat = False
        if self.mode == M_SINGLE:
            b.result = sample if self.collate is None else self.collate(sample)
            return
        if self.mode == M_CUSTOM:
            b.samples[row] = sample
            return
        leaves = _flat_leaves(sample)
        flat = leaves is not None
        if flat:
            # The common sample, (image, label): its structure without a walk.
            nodes = [(K_TUPLE if type(sample) is tuple else K_LIST, None, len(leaves))]
            nodes.extend([None] * len(leaves))
        else:
            leaves = []
            nodes = _flatten(sample, plan, leaves)
        if b.cols is None:
            with self._lock:
                if b.cols is None:
                    cols = _make_columns(self.pool, b.n, leaves, nodes)
                    b.nodes = nodes
                    b.cols = cols
                    first = True
                    self._keep_blocks(cols)
        if not first and not (flat and len(b.nodes) == len(nodes) and b.nodes[0] == nodes[0]):
            # (A flat sample has the batch's structure when the root and the
            # count agree: each child of the root is then a leaf.)
            at = _tree_differs(b.nodes, nodes)
            if at >= 0:
                where = _node_paths(nodes, "sample")[at] if at < len(nodes) else "sample"
                raise ValueError(f"the sample's structure differs from the batch's first sample at "
                                 f"{where}: every sample of a batch must have the same structure")
        self.bytes_collated += _fill_row(b.cols, leaves, row, b.nodes)

    cdef _keep_blocks(self, list cols):
        """Let the pool keep free blocks for the batches in flight (open in
        the window, in the ring, a few held by the user), twice over for mixed
        sizes, so that a steady state allocates nothing (as _Core._copy_batch)."""
        cdef size_t nbytes = 0
        for col in cols:
            if (<_Column>col).kind != C_LIST and isinstance((<_Column>col).out, cnp.ndarray):
                nbytes += <size_t>cnp.PyArray_NBYTES(<cnp.ndarray>(<_Column>col).out)
        if nbytes > self.max_batch_bytes and self.pool.p != NULL:
            self.max_batch_bytes = nbytes
            pf_pool_set_keep(self.pool.p, 2 * (self.window + self.depth + 2) * nbytes)

    cdef _row_failed(self, _Batch b, Py_ssize_t row, key, int wid, exc, str what):
        try:
            _add_note(exc, f"raised in loader thread {self.name}-w{wid} while {what} sample {key!r}, "
                           f"row {row + 1} of batch {b.k + 1} (counted from 1)")
        except Exception:
            pass   # an exception type that refuses notes is still delivered
        if b.failure is None or row < b.fail_row:
            b.failure = exc
            b.fail_row = row
        if b.gen == self.gen:
            self.stop_k = min(self.stop_k, b.k + 1)

    cdef _row_done(self, _Batch b):
        b.done += 1
        self.samples += 1
        if b.done < b.n:
            return
        if self.mode == M_CUSTOM and b.failure is None and b.gen == self.gen:
            try:
                b.result = self.collate(b.samples)
            except BaseException as exc:
                _add_note(exc, f"raised by the collate function of loader {self.name!r} on batch "
                               f"{b.k + 1} (counted from 1)")
                b.failure = exc
            b.samples = None
        b.complete = True
        with self._cv:
            self._cv.notify_all()

    cdef _fail_thread(self, int wid, exc):
        """worker_init raised: the epoch ends with its error (the caller wakes
        the fetch thread once it no longer holds the error)."""
        _add_note(exc, f"raised while starting loader thread {self.name}-w{wid} (worker_init({wid}))")
        self.epoch_failure = exc
        self.stop_k = min(self.stop_k, self.taken)

    cdef _wake_all(self):
        with self._cv:
            self._cv.notify_all()


cdef list _flat_leaves(object sample):
    """The items of a tuple or list sample when each is an array, a number, a
    str or None (leaves the walk would pass or stack as they are); else None."""
    cdef type t = type(sample)
    if t is not tuple and t is not list:
        return None
    for x in sample:
        t = type(x)
        if not (t is cnp.ndarray or t is int or t is float or t is str or t is bool or x is None):
            return None
    return list(sample)


@cython.final
cdef class _EpochSource:
    """One epoch of a _MapStage, as the source of a _Core."""
    cdef _MapStage stage
    cdef unsigned long gen

    def __cinit__(self, _MapStage stage, unsigned long gen):
        self.stage = stage
        self.gen = gen

    def __iter__(self):
        return self

    def __next__(self):
        return self.stage.next_batch(self.gen)


# For prefetch/loader.py: what the stage does with samples.
MAP_STACK = M_STACK
MAP_CUSTOM = M_CUSTOM
MAP_SINGLE = M_SINGLE
