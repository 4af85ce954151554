"""``PrefetchingIter``: a drop-in for ``mx.io.PrefetchingIter``.

Threading contract: ``_Rounds.__next__`` runs on the prefetcher's publisher
thread (it is the source of the PrefetchingIter's Prefetcher); every
``PrefetchingIter`` method runs on the consumer's thread.
"""
import threading

from prefetch._framework import ClosedError, Closing, Options, Prefetcher
from prefetch.mx._device import as_context
from prefetch.mx._mxnet import mx

_MISMATCH = "Number of entry mismatches between iterators"


class _Rounds:
    """The source of a PrefetchingIter's Prefetcher: one round pulls one batch
    from each wrapped iterator and combines them (as mx's iter_next does).

    The Prefetcher takes a slot of its ring (``depth`` slots) before each
    round, and the consumer frees one with each batch it takes: at any quiet
    moment the wrapped iterators have been read exactly ``depth`` batches
    past what the consumer took (or to their end), as mx's class with depth
    1. That makes ``reset()`` deterministic. It holds no reference to the
    PrefetchingIter: the publisher thread must not keep it alive.
    """

    def __init__(self, iters):
        self.iters = iters
        self.lock = threading.Lock()   # held for a round: stop() waits for the one in progress
        self.rounds = 0       # rounds begun
        self.stopped = False  # set by reset()/close(): no round starts after it
        self.done = False     # the iterators ended (or raised): no more rounds

    def __iter__(self):
        return self

    def __next__(self):
        with self.lock:
            batch = None if self.stopped or self.done else self.round()
        if batch is None:
            raise StopIteration
        return batch

    def round(self):
        """Pull one batch from every iterator; None at the end of the data. A
        round that ends the data, raises or finds the iterators disagreeing is
        the last (``done``)."""
        self.rounds += 1
        self.done = True
        batches = []
        for it in self.iters:
            try:
                batches.append(it.next())
            except StopIteration:
                batches.append(None)
        first = batches[0]
        if all(b is None for b in batches):
            return None
        if any(b is None or b.pad != first.pad for b in batches):
            raise AssertionError(_MISMATCH)
        self.done = False
        # The parts of the combined batch: the consumer's thread makes the
        # DataBatch (as mx's class does), so the prefetcher copies a tuple and
        # lists, not a DataBatch's attributes.
        return (sum([list(b.data) for b in batches], []),
                sum([[] if b.label is None else list(b.label) for b in batches], []),
                first.pad, first.index)

    def stop(self):
        """No round starts after this, and the one in progress has ended
        (reset() needs the iterators quiet; close() sets ``stopped`` alone: it
        must not wait on a stuck source, the prefetcher's close() bounds that)."""
        self.stopped = True
        try:
            with self.lock:
                pass
        except BaseException:
            self.stopped = False   # KeyboardInterrupt in reset(): nothing was dropped, carry on
            raise

    def top_up(self, rounds):
        """After stop() and the prefetcher's close(): read the iterators to
        ``rounds`` (where an undisturbed prefetcher would be: ``depth`` past
        the consumer), so a reset finds them where mx's class leaves them."""
        while not self.done and self.rounds < rounds:
            self.round()


def _descs(iters, renames, attr):
    if renames is None:
        return sum([list(getattr(i, attr, None) or []) for i in iters], [])
    return sum([[
        mx.io.DataDesc(r[x.name], x.shape, x.dtype)
        if isinstance(x, mx.io.DataDesc) else mx.io.DataDesc(*x)
        for x in (getattr(i, attr, None) or [])
    ] for r, i in zip(renames, iters)], [])


def _current(field):
    """mx's ``get<field>()``: the current batch's ``field``, once open."""
    def get(self):
        self._check_open()
        return getattr(self.current_batch, field)
    get.__name__, get.__qualname__ = f"get{field}", f"PrefetchingIter.get{field}"
    return get


class PrefetchingIter(mx.io.DataIter, Closing):
    """Prefetches batches of one or several DataIters on a background thread,
    each batch a fresh copy (drop-in for ``mx.io.PrefetchingIter``).

    Parameters
    ----------
    iters : DataIter or list of DataIter
        Iterators combined batch by batch (data and labels concatenated, pad
        and index from the first).  Any object with ``reset()`` and ``next()``.
    rename_data, rename_label : None or list of dict
        The i-th dict renames entries of ``iters[i].provide_data`` (``_label``).
    depth : int
        Batches prefetched ahead.  With ``depth=1`` every sequence of calls
        returns what ``mx.io.PrefetchingIter`` returns.
    device : mx.Context or None
        Deliver the NDArrays on this context (e.g. ``mx.gpu(0)``), the copy done
        in the background.
    timeout, max_bytes, workers, name
        As for ``prefetch.Prefetcher``.

    Raises
    ------
    prefetch.ClosedError
        From ``next()``, ``iter_next()`` or ``reset()`` after ``close()``.
    AssertionError
        When the iterators disagree on length or pad (as mx's class).

    Examples
    --------
    >>> it1 = mx.io.NDArrayIter({'data': mx.nd.ones((100, 10))}, batch_size=25)
    >>> it2 = mx.io.NDArrayIter({'data': mx.nd.ones((100, 10))}, batch_size=25)
    >>> with PrefetchingIter([it1, it2], rename_data=[{'data': 'data_1'},
    ...                                               {'data': 'data_2'}]) as it:
    ...     [d.name for d in it.provide_data]
    ['data_1', 'data_2']
    """

    def __init__(self, iters, rename_data=None, rename_label=None, depth=4,
                 device=None, *, timeout=None, max_bytes=None, workers=1, name=None):
        super().__init__()
        self._closed = True  # until a prefetcher runs: close() must work half-built
        if not isinstance(iters, list):
            iters = [iters]
        if not iters:
            raise ValueError("iters must hold at least one iterator, got []")
        for it in iters:
            if not (callable(getattr(it, "next", None))
                    and callable(getattr(it, "reset", None))):
                raise TypeError(
                    f"iters: each must have next() and reset() (a DataIter), got {it!r}")
        # Every option checked here, by the rules Prefetcher applies (one set of
        # messages), before any prefetcher exists.
        depth = Options.check("prefetch", name=name, depth=depth, workers=workers, max_bytes=max_bytes,
                              timeout=timeout).depth
        if device is not None:
            as_context(device)   # fail here, before any prefetcher exists
        self.n_iter = len(iters)
        self.iters = iters
        self.rename_data = rename_data
        self.rename_label = rename_label
        descs = self.provide_data
        self.batch_size = descs[0][1][0] if descs else getattr(iters[0], "batch_size", 0)
        self.current_batch = None
        self._options = dict(depth=depth, device=device, timeout=timeout,
                             max_bytes=max_bytes, workers=workers, name=name)
        self._start()
        self._closed = False

    def _start(self):
        self._rounds = _Rounds(self.iters)
        self._pf = Prefetcher(self._rounds, **self._options)   # closed by close(), reset(), or when dropped

    @property
    def provide_data(self):
        return _descs(self.iters, self.rename_data, "provide_data")

    @property
    def provide_label(self):
        return _descs(self.iters, self.rename_label, "provide_label")

    @property
    def closed(self):
        return self._closed

    def _check_open(self):
        if self._closed:
            raise ClosedError(f"{type(self).__name__} is closed")

    def reset(self):
        """Drop what was prefetched, reset every iterator, and start prefetching."""
        self._check_open()
        taken = self._pf.stats().consumed   # the batches the consumer took
        self._rounds.stop()   # the round in progress ends; none starts after it
        self._pf.close()
        try:   # a source error here is raised, after the reset below
            self._rounds.top_up(taken + self._options["depth"])
        finally:
            for it in self.iters:
                it.reset()
            self._start()

    def iter_next(self):
        self._check_open()
        try:
            batch = next(self._pf)   # after the end (or an error), StopIteration again
        except StopIteration:
            return False
        data, label, pad, index = batch
        self.current_batch = mx.io.DataBatch(data, label, pad, index, provide_data=self.provide_data,
                                             provide_label=self.provide_label)
        return True

    def next(self):
        if self.iter_next():
            return self.current_batch
        raise StopIteration

    getdata, getlabel, getindex, getpad = map(_current, ("data", "label", "index", "pad"))

    def stats(self):
        """``prefetch.Stats`` of the current epoch's prefetcher."""
        return self._pf.stats()

    def close(self):
        """Stop prefetching, drop what was prefetched, and wait for the engine to
        free it; idempotent.  Batches the caller holds stay valid."""
        if self._closed:
            return
        self._closed = True
        self.current_batch = None
        self._rounds.stopped = True   # no round starts after this
        self._pf.close()   # it synchronises the engine once

    def __del__(self):
        # Scripts free mx's class with an explicit __del__(); keep that working.
        # The engine sync is skipped when the GC runs this on an engine thread.
        if not getattr(self, "_closed", True):
            self.close()

    def __repr__(self):
        state = "closed" if self._closed else "open"
        return (f"<prefetch.mx.PrefetchingIter n_iter={self.n_iter} "
                f"depth={self._options['depth']} {state}>")
