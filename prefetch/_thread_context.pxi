# _thread_context.pxi (included by _core.pyx): a loader thread's context, made
# by its crew (_threads.pxi) and passed to each call that needs the thread:
# its number, WorkerInfo, sample, batch copy, stream worker, and what it is
# busy with. sample_rng() and
# worker_info(), which the user calls from dataset[i] with no argument, alone
# find it through one thread-local, set and cleared by the context itself.

cdef object _current = threading.local()   # .context: the calling loader thread's _ThreadContext


cdef class _ThreadContext:
    """One loader thread's context: made by its crew (_threads.pxi) before
    the thread starts, used by that thread alone, but for what it is busy
    with, which the crew reads under the stage's condition."""

    def __cinit__(self, work, int wid):
        self.work = work
        self.wid = wid

    cdef void busy(self, key, int64_t since):
        """It loads ``key`` since ``since`` (0: it is idle)."""
        self.busy_since = since
        self.busy_key = key

    cdef void enter(self):
        """The calling thread is this context's (sample_rng(), worker_info())."""
        _current.context = self

    cdef void leave(self):
        _current.context = None
        self.info = self.sample = self.copy = self.reader = self.filling = None

    cdef _BatchCopy batch_copy(self, _Pool pool, delivery):
        """The thread's batch copy (made on first use, freed with the thread):
        no helper threads, the loader thread copies; the stage's keep policy,
        not its own."""
        if self.copy is None:
            self.copy = _BatchCopy(pool, 1, True, delivery, 0)
        return self.copy

    cdef void loads(self, Py_ssize_t epoch, index, seed, int workers):
        """It loads sample ``index`` of ``epoch`` next (sample_rng()'s
        index); the next epoch's batches may open before it starts."""
        if self.info.epoch != epoch:
            self.info = WorkerInfo(self.wid, workers, seed, epoch, self.info.dataset)
        self.sample = (seed, epoch, index)

    cdef tuple read_stream(self, Py_ssize_t epoch, Py_ssize_t workers, seed, name):
        """Its worker reads its next batch of the stream in epoch ``epoch``:
        (its rows, whether the stream ended, the stream's error or None)."""
        reader = self.reader
        try:
            reader.start(epoch)
            # sample_rng()'s index: worker w's batch j is the (j * workers + w)th,
            # whenever the other workers end
            self.sample = (seed, epoch, reader.batches * workers + self.wid)
            keys, ended = reader.read()
            return keys, ended, None
        except BaseException as exc:
            failure = _stop_as_error(exc, "the stream")
            _note_batch(failure, f"in loader thread {name}-w{self.wid}",
                        f"reading {{batch}} of worker {self.wid}'s stream", reader.batches + 1)
            return None, True, failure
        finally:
            self.sample = None


cdef _ThreadContext _calling_thread():
    """The calling loader thread's context, or None on any other thread."""
    return getattr(_current, "context", None)


cdef object _as_index(key):
    """``key`` as an int where it is an integer (an int, a numpy or framework
    integer; not a bool), else None."""
    if type(key) is int:
        return key
    if isinstance(key, (bool, np.bool_)):
        return None   # numpy < 2.3 only warns (DeprecationWarning) where 2.3 raises: one answer
    try:
        return operator.index(key)
    except TypeError:
        return None


def sample_rng():
    """A ``numpy.random.Generator`` for the sample being loaded: determined by
    the loader's ``seed``, the epoch and the sample's index alone, whichever
    thread runs it and however many there are.

    Call it inside ``dataset[i]`` (or the function given to ``prefetch.map``);
    anywhere else it raises ``RuntimeError``.
    """
    cdef _ThreadContext context = _calling_thread()
    sample = None if context is None else context.sample
    if sample is None:
        raise RuntimeError("sample_rng() can only be called inside dataset[i] or map's function while a "
                           "prefetch loader thread runs it; this thread is not loading a sample (to draw "
                           "elsewhere, make a numpy.random.Generator of your own)")
    seed, epoch, key = sample
    # Any integer is an index (a numpy permutation as the sampler): its
    # stream is the one of the same int.
    index = _as_index(key)
    if index is None or index < 0:
        raise TypeError(f"sample_rng() needs a non-negative int sample index, got {key!r} "
                        f"({type(key).__name__})")
    # Philox is counter based: one key per (seed), and a counter whose high
    # words are (index, epoch), so no two samples' streams overlap.
    return np.random.Generator(np.random.Philox(key=seed, counter=[0, 0, index, epoch]))


def worker_info():
    """The ``WorkerInfo`` of the loader thread calling it, or None elsewhere."""
    cdef _ThreadContext context = _calling_thread()
    return None if context is None else context.info
