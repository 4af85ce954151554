"""``Loader`` and ``map``: per-sample work on threads. ``iter(loader)`` starts
an epoch, the stage of a new compiled ``_Core`` (the map stage is in
``_map.pxi``, the collate in ``_collate.pxi``), and returns its iterator.
"""
from __future__ import annotations

import collections.abc
import itertools
import math
import os
import threading
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Iterator, NamedTuple, Optional, TypeVar

import numpy as np

from prefetch import adapters
from prefetch._core import (
    MAP_CUSTOM,
    MAP_SINGLE,
    MAP_STACK,
    _Core,
    _fork_epoch,
    _Iterator,
    _MapStage,
    _Pool,
    _StageHooks,
    assembly,
    sample_rng,
    worker_info,
)
from prefetch._lifecycle import _Lifecycle
from prefetch._options import (
    AUTO_MAX_THREADS,
    MAX_EPOCH,
    Options,
    check_batch_size,
    check_bool,
    check_callable,
    check_dataset,
    check_habits,
    check_int,
    usable_cpus,
)
from prefetch._resume import Identity, Position, _Resume, _skipping, order_part, stateful, try_state
from prefetch._streams import Workers, stream_copy
from prefetch._types import ClosedError, Stats

__all__ = ["Loader", "map", "sample_rng", "worker_info"]

T = TypeVar("T")


class _OwnOrder(NamedTuple):
    """An epoch whose order the Loader gives itself (no sampler): its key
    lists are a function of these alone (compared whole: equal orders, equal
    batches), as a drop-in's plan of its framework's order is."""
    n: int
    seed: int
    epoch: int
    shuffle: bool
    batch_size: Optional[int]
    drop_last: bool

    def batches(self) -> Iterator[list[Any]]:
        """The key lists, computed as they are first read (on a loader thread)."""
        keys: Iterator[Any] = (ints(np.random.default_rng([self.seed, self.epoch]).permutation(self.n))
                               if self.shuffle else iter(range(self.n)))
        yield from _batched(keys, self.batch_size, self.drop_last)


def ints(perm: Any) -> Iterator[int]:
    """A permutation's indices (an array with slicing and tolist()) as ints, a
    slice at a time: the whole of it as a list would hold an int object per
    index (about 40 bytes each) for the epoch, the array holds 8."""
    for start in range(0, len(perm), 4096):
        yield from perm[start:start + 4096].tolist()


def _batched(keys: Iterator[Any], size: Optional[int], drop_last: bool) -> Iterator[list[Any]]:
    """The key lists of ``size`` keys each (None: each key alone)."""
    if size is None:   # per sample: no islice and list per key
        yield from ([k] for k in keys)
        return
    while True:
        chunk = list(itertools.islice(keys, size))
        if len(chunk) < size:
            if chunk and not drop_last:
                yield chunk
            return
        yield chunk


class _Epoch(_Iterator, Generic[T]):
    """One epoch of a ``Loader`` or ``map``: what ``iter(loader)`` returns.
    Threads calling ``next()`` on it share the epoch, each batch going to one."""

    _core: _Core   # made with its epoch's core, which it keeps

    def __init__(self, core: _Core, loader: "_Threaded[Any]") -> None:
        self._core = core
        self._timeout = loader._timeout
        # Keeps the loader (and so its threads) alive while its epoch is
        # iterated: `for batch in Loader(...)` holds only this object.
        self._loader = loader

    def __repr__(self) -> str:
        return f"<epoch iterator of {self._loader!r}: {self._core.state}>"

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    # What a drop-in's iterator asks of its epoch (prefetch/_framework.py):

    @property
    def failed_batches(self) -> int:
        """Batch errors raised by next(), the epoch going on after each (a
        drop-in's continue policy): a next() that raised and changed it
        raised that batch's error, not the epoch's end."""
        return self._core.failed

    @property
    def running(self) -> bool:
        """The epoch has not ended, failed or been closed."""
        return self._core.state == "running"

    def stop(self) -> None:
        """The epoch ends here (a drop-in's pass dropped before its end): its
        loading stops, and a next() on it ends it (StopIteration)."""
        self._core.end_replaced()

    if TYPE_CHECKING:
        def __next__(self) -> T: ...
        def __iter__(self) -> "_Epoch[T]": ...


class _Threaded(_Lifecycle, Generic[T]):
    """What Loader and map share: a _MapStage whose threads outlive the
    epochs, and a _Core per epoch that publishes its batches."""

    _kind = "loader"
    _epoch = 0
    _streams: Optional[Workers] = None   # an iterable dataset's workers; None: map-style
    # What a drop-in gives its map stage (prefetch/_framework.py): each
    # thread's own load, a lookahead, its failure policy, the GIL notice's
    # remedy and whether it was given.
    _hooks: dict[str, Any] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Before __init__ (here, not on the subclasses, whose signature
        # help() shows): a framework loader's name for one of the arguments
        # gets the message naming ours, not Python's "unexpected keyword".
        check_habits(cls.__name__, kwargs)
        return super().__new__(cls)

    def _setup(self, load: Optional[Callable[[Any], Any]], mode: int, collate: Any, options: Options,
               device: Any, worker_init: Any) -> None:
        self._options = options
        self._timeout = options.timeout
        self._epoch_lock = threading.RLock()   # starting an epoch is atomic (re-entrant: signal handlers)
        self._fork = _fork_epoch()
        worker_init = check_callable("worker_init", worker_init)
        # Without a seed the runs differ, but sample_rng() still gives each
        # sample its own stream.
        self._seed = int.from_bytes(os.urandom(16), "little") if options.seed is None else options.seed
        self._pool = _Pool()
        self._thread_states = adapters._capture_thread_states()
        auto = (AUTO_MAX_THREADS, usable_cpus()) if options.workers is None else None
        # The assembly is the device's one holder: the stage closes it.
        asm = assembly(mode, collate, self._pool, None if device is None else adapters._open_device(device),
                       options.name)
        hooks = self._hooks if self._streams is None else dict(self._hooks, per_thread=self._streams, stream=True)
        self._stage = _MapStage(load, asm, options, worker_init, self._seed, self._thread_states, auto,
                                _StageHooks(**hooks))
        self._owned = (self._stage, self._pool)
        self._name = options.name
        self._remember_caller()

    def adopt_seed(self, seed: int) -> None:
        """A drop-in's seed for ``sample_rng()`` (its loaders share one, so the
        draws do not depend on which of them runs an epoch; a framework's own)."""
        self._seed = self._stage.seed = seed

    # -- per epoch ----------------------------------------------------------

    def _keys(self, epoch: int) -> tuple[Iterator[list[Any]], int, int]:
        """The epoch's batches of keys, the key range (-1: any key) and the rows per batch."""
        raise NotImplementedError

    _started = False                    # an epoch has started
    _position: Optional[Position] = None   # a Loader's resume state; None: map's, which has none

    def _order(self, epoch: int) -> Any:
        """What epoch ``epoch``'s order is a function of, where it is known
        before the epoch starts (its batches may then be opened before): a
        plan whose ``batches()`` are its key lists; None where it is not."""
        return None

    def _start_epoch(self) -> _Core:
        """Start the next epoch (closing the current one) and return its core."""
        with self._epoch_lock:
            if self._closing:
                raise ClosedError(f"{self._kind} {self._name!r} is closed")
            if _fork_epoch() != self._fork:
                raise RuntimeError(
                    f"{self._kind} {self._name!r} was inherited through os.fork(); its threads "
                    f"exist only in the parent process. Create a new {self._kind} in the child.")
            old = self._core
            if old is not None:
                old.end_replaced()   # a next() on its iterator meets the end of its epoch
            epoch, position = self._epoch, self._position
            record = None if position is None else position.begin(epoch)
            batches, n_keys, rows = self._keys(epoch)
            if record is not None and record.skipped is not None and record.numbers is not None:
                batches = _skipping(batches, record.skipped, record.numbers)
            # Where the orders are the loader's own, the next epoch's first
            # batches are opened as this one's last are consumed, and this
            # one's may have been opened already (a resumed epoch skips some:
            # never opened ahead). From the second epoch on: a loader iterated
            # once never loads for an epoch it is not asked for.
            order = self._order(epoch) if position is None or position.resume is None else None
            after = self._order(epoch + 1) if self._started else None
            self._started = True
            following = None if after is None else (after, epoch + 1, after.batches())
            stage = self._stage.start_epoch(batches, epoch, n_keys, self._options.workers or 0, rows,
                                            order, following)
            self._epoch = epoch + 1
            core = _Core(stage, pool=self._pool, kind=self._kind, **self._options.core())
            if position is not None and record is not None:
                position.started(record, core, stage)
            self._install(core, self._thread_states)
            if self._closing:
                # close() ran meanwhile (another thread, a signal handler) and
                # may have read the old core: this one is closed here.
                core.close()
                raise ClosedError(f"{self._kind} {self._name!r} was closed while its epoch started")
            return core

    def __iter__(self) -> Any:
        with self._epoch_lock:
            epoch: _Epoch[Any] = _Epoch(self._start_epoch(), self)
            if self._position is not None and self._position.record is not None:
                self._position.record.iterator = weakref.ref(epoch)
            return epoch

    def _first_core(self) -> _Core:
        # next(loader) before any iter(): the first epoch, started once
        # however many threads ask at the same time.
        with self._epoch_lock:
            return self._core if self._core is not None else self._start_epoch()

    # -- lifecycle ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once ``close()`` has run."""
        return self._closing

    def stats(self) -> Stats:
        """A frozen snapshot: the current epoch's batch counters and the
        threads' counters over every epoch (see ``prefetch.Stats``)."""
        core = self._core
        if core is None:
            return Stats(depth=self._options.depth, **self._stage.stats())
        return Stats(**core.stats())

    def __repr__(self) -> str:
        core = self._core
        state = "closed" if self._closing else ("not started" if core is None else core.state)
        return (f"<{type(self).__name__} name={self._name!r} workers={self._stage.threads} "
                f"epoch={self._epoch - 1} state={state}>")

    if TYPE_CHECKING:
        def __next__(self) -> T: ...


class Loader(_Threaded[T]):
    """Load ``dataset[i]`` on several threads and hand out whole batches, as
    fresh arrays that nothing else can reach (docs/loader.md).

    The default collate copies every sample's arrays straight into its row of
    a pooled batch, without the GIL; the batches are the same for every
    ``workers`` value. Each ``iter(loader)`` starts an epoch (ending the one
    before) and returns its iterator, which threads may share; ``next(loader)``
    takes from the current epoch, starting the first one if none has
    (docs/loader.md, "Epochs").

    ``dataset[i]`` runs on several threads at once: one that reads through a
    single shared handle (an open file, a database cursor) must open one per
    thread (a ``threading.local``, or ``worker_init``). Draw augmentations
    from ``prefetch.sample_rng()``, not from the global generators the
    threads share.

    Parameters
    ----------
    dataset : object with ``__getitem__`` and ``__len__``, or an iterable dataset
        A list, a numpy array, a framework's map-style dataset... An iterable
        dataset (``__iter__``; not a generator or another one-shot iterator)
        is iterated by each thread from a copy of its own, sharded by
        ``prefetch.worker_info()``; ``workers="auto"`` is then one thread.
    batch_size : int or None, default 1
        Samples per batch; None hands out every sample on its own (as
        ``collate(sample)`` where ``collate`` is given).
    shuffle : bool, default False
        A new order per epoch, from ``seed`` and the epoch alone when ``seed`` is given.
    sampler : iterable of indices, optional
        Re-iterated each epoch; told ``set_epoch(epoch)`` first when it has it
        (a distributed sampler: one loader per rank shards the data set).
    batch_sampler : iterable of lists of indices, optional
        Gives the batches itself; excludes ``batch_size``, ``shuffle``,
        ``sampler`` and ``drop_last``.
    drop_last : bool, default False
        Drop the last batch when it is smaller than ``batch_size``.
    workers : int or "auto", default "auto"
        Threads calling ``dataset[i]``; "auto" grows them while that is
        measured faster (``stats().workers``, ``stats().tune_reason``). Where
        the threads take turns on the GIL, a ``prefetch.GILBoundWarning``
        says so, once.
    collate : callable(list of samples) -> batch, optional
        Replaces the default collate; runs on a loader thread, and its result
        is handed out like a ``Prefetcher`` batch.
    seed : int, optional
        Makes the shuffle and ``prefetch.sample_rng()`` reproducible.
    ordered : bool, default True
        Batches in sampler order; False: as they complete.
    depth, device, timeout, max_bytes, name
        As for ``Prefetcher``.
    worker_init : callable(worker_id), optional
        Called once on each loader thread before its first sample.
    epoch : int, default 0
        The number of the first epoch (see ``set_epoch``).

    ``state_dict()`` and ``load_state_dict()`` resume a run exactly
    (docs/loader.md, "Resuming a run"): a custom sampler must give the same
    order again, through its own ``state_dict()`` and ``load_state_dict()``
    or by being deterministic for its epoch.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it and the value given.
    """

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1, *, shuffle: bool = False,
                 sampler: Optional[Iterable[Any]] = None,
                 batch_sampler: Optional[Iterable[list[Any]]] = None, drop_last: bool = False,
                 workers: Any = "auto", collate: Optional[Callable[[list[Any]], Any]] = None,
                 seed: Optional[int] = None, ordered: bool = True, depth: int = 4, device: Any = None,
                 timeout: Optional[float] = None, max_bytes: Optional[int] = None,
                 name: Optional[str] = None,
                 worker_init: Optional[Callable[[int], Any]] = None, epoch: int = 0) -> None:
        stream = self._stream if self._stream is not None else _is_stream(dataset)
        if not stream:
            check_dataset(dataset, "for an iterable dataset, __iter__ (making a new iterator each time); "
                                   "for an iterator or generator, prefetch.map(fn, iterable) or Prefetcher")
        elif workers == "auto":
            workers = 1   # a stream shards itself by its worker count: it is the user's to choose
        options = Options.check("loader", name=name, depth=depth, workers=workers, max_bytes=max_bytes,
                                timeout=timeout, seed=seed, ordered=ordered)
        shuffle = check_bool("shuffle", shuffle)
        drop_last = check_bool("drop_last", drop_last)
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler gives the batches itself: it excludes batch_size, "
                                 "shuffle, sampler and drop_last")
            if not hasattr(batch_sampler, "__iter__"):
                raise TypeError(f"batch_sampler must be an iterable of lists of indices, got "
                                f"{batch_sampler!r} ({type(batch_sampler).__name__})")
        if sampler is not None:
            if shuffle:
                raise ValueError("sampler gives the order itself: it excludes shuffle=True")
            if not hasattr(sampler, "__iter__"):
                raise TypeError(f"sampler must be an iterable of indices, got {sampler!r} "
                                f"({type(sampler).__name__})")
        if stream and (shuffle or sampler is not None or batch_sampler is not None):
            raise ValueError(f"an iterable dataset gives its samples in its own order: it excludes shuffle, "
                             f"sampler and batch_sampler, got shuffle={shuffle!r}, sampler={sampler!r}, "
                             f"batch_sampler={batch_sampler!r}")
        collate = check_callable("collate", collate)
        self._epoch = check_int("epoch", epoch, 0, MAX_EPOCH)
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler: Any = sampler
        self.batch_sampler: Any = batch_sampler
        self.drop_last = drop_last
        self.shuffle = shuffle
        if batch_size is None and batch_sampler is None:
            mode = MAP_SINGLE
        else:
            mode = MAP_STACK if collate is None else MAP_CUSTOM
        if stream:
            self._streams = Workers(dataset, workers, batch_size or 1, drop_last, self._replicate or stream_copy)
        self._setup(None if stream else dataset.__getitem__, mode, collate, options, device, worker_init)
        holder = batch_sampler if batch_sampler is not None else sampler
        identity = self._identity or Identity(
            dataset, stream=stream, batch_size=batch_size, order=order_part(shuffle, sampler, batch_sampler),
            sampler_state=stateful(holder), workers=None if self._streams is None else self._streams.count)
        self._position = Position(identity, sampler=holder, streams=self._streams, ordered=options.ordered)

    _position: Position
    _identity: Optional[Identity] = None   # a drop-in's, what its resume state is of (None: the Loader's own)
    _replicate: Optional[Callable[[Any, int], Any]] = None   # a drop-in's worker copy of a stream
    _stream: Optional[bool] = None   # a drop-in's word on whether its dataset is a stream (None: _is_stream's)

    # -- epochs and resuming ------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter(loader)`` starts epoch ``epoch``, and the ones after
        count on from it: what the shuffle and ``sample_rng()`` use, and what a
        sampler's ``set_epoch`` hears. A state loaded for another epoch is
        dropped; for the same epoch it is kept."""
        epoch = check_int("epoch", epoch, 0, MAX_EPOCH)
        with self._epoch_lock:
            self._position.set_epoch(epoch)
            if epoch != self._epoch:
                self._stage.drop_following()   # not the epoch opened early
            self._epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: a small JSON-serialisable dict (its fields:
        docs/loader.md, "Resuming a run"), taken at any moment, from any
        thread, without pausing the loader threads; batches loaded ahead and
        not yet delivered are not counted. Once an epoch has ended, the state
        is the next epoch's start."""
        with self._epoch_lock:
            return self._position.state_dict(self._epoch, self._seed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` (from ``state_dict()``, of a loader over the
        same data, batch size and sampler) was taken: the next
        ``iter(loader)`` delivers the batches an uninterrupted run would have
        delivered next. Call it before iterating, between epochs, or after a
        ``break`` out of an epoch's loop (that epoch then ends).

        Raises
        ------
        TypeError
            For a state that is not a dict.
        ValueError
            For a state of another format or version, dataset kind or length,
            batch size, seed, order (shuffled or not, the sampler's kind) or
            count of workers reading a stream, one its sampler refuses, or
            one truncated or edited; the loader is unchanged.
        ClosedError
            Once the loader is closed.
        RuntimeError
            While an epoch is in progress (its iterator is still held).
        """
        if self._closing:
            raise ClosedError(f"loader {self._name!r} is closed: cannot load a state into it")
        try:
            total = len(self)
        except TypeError:
            total = -1   # a stream, or a sampler without len(): nothing to check against
        position = self._position
        resume, seed = position.identity.check(state, self._seed if self._options.seed is not None else None, total)
        if position.sampler is not None and resume.sampler is not None:
            try_state(position.sampler, resume.sampler)   # the sampler's part: its own to check
        self._load_checked(resume, seed)

    def _load_checked(self, resume: _Resume, seed: int) -> None:
        """Continue where a state checked by ``load_state_dict`` (or a drop-in's) was taken."""
        with self._epoch_lock:
            if self._closing:
                raise ClosedError(f"loader {self._name!r} is closed: cannot load a state into it")
            record = self._position.record
            if record is not None and record.core.state == "running":
                if record.iterating():
                    raise RuntimeError(
                        f"cannot load a state into {self!r} while its epoch {record.epoch} is in progress; "
                        "load it before iterating, once the epoch has ended, or after a break out of its loop")
                # Its iterator is gone (a break): the epoch ends here, and
                # next(loader) starts the one the state continues.
                record.core.close()
                self._core = None
            self._stage.drop_following()   # the next epoch is the state's
            self.adopt_seed(seed)
            self._epoch = resume.epoch
            self._position.resume = resume

    def _keys(self, epoch: int) -> tuple[Any, int, int]:
        if self._streams is not None:   # the workers in turn, from the one due (_map.pxi)
            return (self._streams.count, self._streams.turn), -1, 1
        n = len(self.dataset)
        if self.batch_sampler is not None:
            return self._iter_sampler(self.batch_sampler, "batch_sampler", epoch), n, 1
        if self.sampler is None:   # the loader's own order: read lazily, on a loader thread
            batches = _OwnOrder(n, self._seed, epoch, self.shuffle, self.batch_size, self.drop_last).batches()
        else:
            batches = _batched(self._iter_sampler(self.sampler, "sampler", epoch), self.batch_size, self.drop_last)
        return batches, n, self.batch_size or 1

    def _order(self, epoch: int) -> Any:
        # Only an order no user code gives: a sampler may change between
        # epochs (its set_epoch called by the user, a state loaded into it).
        if self.sampler is not None or self.batch_sampler is not None or self._streams is not None:
            return None
        return _OwnOrder(len(self.dataset), self._seed, epoch, self.shuffle, self.batch_size, self.drop_last)

    _sampler_read = False   # a one-shot sampler (an iterator) gave its epoch

    def _iter_sampler(self, sampler: Any, arg: str, epoch: int) -> Iterator[Any]:
        """iter(sampler), told ``set_epoch(epoch)`` first where it has it (a
        distributed sampler reshuffles per epoch); a one-shot one (a generator,
        an iterator: iter() returns it) gives one epoch, and the next raises
        rather than come out empty."""
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        keys: Iterator[Any] = iter(sampler)
        if keys is sampler:
            if self._sampler_read:
                raise RuntimeError(
                    f"{self!r} cannot start another epoch: its {arg} is a one-shot iterator "
                    f"({type(sampler).__name__}), used up by an earlier epoch; to loop again, "
                    f"pass a re-iterable {arg} (a list, a range, an array, a Sampler object)")
            self._sampler_read = True
        return keys

    def __len__(self) -> int:
        """Batches per epoch: the batch sampler's length, or the sampler's (or dataset's) in batches."""
        if self._streams is not None:
            raise TypeError(f"{self!r} reads an iterable dataset: its batches are not counted ahead")
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            if not isinstance(self.sampler, collections.abc.Sized):
                raise TypeError(f"the sampler of {self!r} has no len()")
            n = len(self.sampler)
        else:
            n = len(self.dataset)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)


def _is_stream(dataset: Any) -> bool:
    """An iterable dataset: ``__iter__`` without ``__getitem__`` and
    ``__len__``; not a one-shot iterator of Python's own (a generator, of
    ``iter(list)``, ``map``, ``itertools``), while a user's class that is its
    own iterator is a stream whose ``__iter__`` restarts it."""
    cls = type(dataset)
    one_shot = isinstance(dataset, collections.abc.Iterator) and (
        isinstance(dataset, types.GeneratorType) or cls.__module__ in ("builtins", "itertools"))
    return hasattr(cls, "__iter__") and not (hasattr(cls, "__getitem__") and hasattr(cls, "__len__")) \
        and not one_shot


class _Mapped(_Threaded[T]):
    """What ``prefetch.map`` returns."""

    def __init__(self, fn: Callable[[Any], T], iterable: Iterable[Any],
                 worker_init: Optional[Callable[[int], Any]], **options: Any) -> None:
        check_callable("fn", fn, optional=False)
        try:
            items = iter(iterable)
        except TypeError:
            raise TypeError(f"iterable must be iterable, got {iterable!r} ({type(iterable).__name__})") from None
        # A one-shot iterator is read once; a re-iterable one again each epoch.
        self._items: Optional[Iterator[Any]] = items
        self._iterable = None if items is iterable else iterable
        self._setup(fn, MAP_SINGLE, None, Options.check("loader", **options), None, worker_init)

    def _keys(self, epoch: int) -> tuple[Iterator[list[Any]], int, int]:
        items = self._items
        self._items = None
        if items is None:
            if self._iterable is None:
                raise RuntimeError(f"{self!r} has ended and its iterable is a one-shot iterator; to loop "
                                   "again, pass a re-iterable (a list, a range)")
            items = iter(self._iterable)
        return ([item] for item in items), -1, 1

    def __len__(self) -> int:
        if not isinstance(self._iterable, collections.abc.Sized):
            raise TypeError(f"the iterable of {self!r} has no len()")
        return len(self._iterable)


def map(fn: Callable[[Any], T], iterable: Iterable[Any], *, workers: Any = "auto", ordered: bool = True,
        depth: int = 4, timeout: Optional[float] = None, name: Optional[str] = None,
        worker_init: Optional[Callable[[int], Any]] = None, **unknown: Any) -> _Mapped[T]:
    """``fn(item)`` for each item of ``iterable``, on ``workers`` threads.

    Results come out in order (``ordered=False``: as they complete), each
    handed out like a ``Prefetcher`` batch: copied unless only it holds its
    arrays, and copied on the thread that made it before that thread calls
    ``fn`` again. ``iterable`` itself is read by one thread at a time. The
    result is iterated like a ``Loader`` (``iter()`` starts a pass over
    ``iterable``; ``next()`` takes from the current one), with ``close()``,
    ``with``, ``stats()`` and the same error and memory rules.
    """
    if unknown:
        # A framework loader's name for one of the arguments gets the message
        # naming ours; any other, Python's own.
        check_habits("map", unknown)
        raise TypeError(f"map() got an unexpected keyword argument {next(iter(unknown))!r}")
    return _Mapped(fn, iterable, worker_init, name=name, depth=depth, workers=workers, timeout=timeout,
                   ordered=ordered)
