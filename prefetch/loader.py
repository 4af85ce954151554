"""``Loader`` and ``map``: per-sample work on threads.

``dataset[i]`` (or ``fn(item)``) runs on several threads at once; with the
default collate each sample is copied straight into its row of a pooled batch
block by the thread that loaded it, and whole batches reach the consumer
through the same compiled ring, consumer side and lifecycle as
``Prefetcher``'s (the stage is in ``_map.pxi``, the collate in
``_collate.pxi``).
"""
from __future__ import annotations

import functools
import itertools
import math
import numbers
import os
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Iterator, Optional, Sized, TypeVar

import numpy as np

from prefetch import adapters
from prefetch._core import (
    MAP_CUSTOM,
    MAP_SINGLE,
    MAP_STACK,
    _Core,
    _EpochSource,
    _MapStage,
    _Pool,
    sample_rng,
    worker_info,
)
from prefetch._lifecycle import _Lifecycle
from prefetch._types import ClosedError, Stats
from prefetch.iterator import MAX_BYTES, MAX_DEPTH, MAX_WORKERS, _check_int, _check_timeout, _names

__all__ = ["Loader", "map", "sample_rng", "worker_info"]

T = TypeVar("T")
# workers="auto" grows past the CPUs only while they stay idle (I/O-like
# samples); this bounds the threads even then.
AUTO_MAX_THREADS = 64


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _check_workers(value: Any) -> Optional[int]:
    """None for "auto", else the thread count."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"workers must be an int >= 1 or 'auto', got {value!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"workers must be an int >= 1 or 'auto', got {value!r} ({type(value).__name__})")
    return _check_int("workers", value, 1, MAX_WORKERS)


def _check_callable(arg: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{arg} must be callable or None, got {value!r} ({type(value).__name__})")
    return value


def _check_bool(arg: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{arg} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


def _tell_epoch(sampler: Any, epoch: int) -> None:
    """A sampler with set_epoch (a distributed sampler) reshuffles per epoch."""
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


def _chunks(keys: Iterator[Any], size: int, drop_last: bool) -> Iterator[list[Any]]:
    while True:
        chunk = list(itertools.islice(keys, size))
        if len(chunk) < size:
            if chunk and not drop_last:
                yield chunk
            return
        yield chunk


class _Threaded(_Lifecycle):
    """What Loader and map share: a _MapStage whose threads outlive the
    epochs, and a _Core per epoch that takes its batches."""

    _kind = "loader"
    _epoch = 0

    def _setup(self, load: Callable[[Any], Any], mode: int, collate: Any, workers: Any, seed: Any,
               ordered: Any, depth: Any, device: Any, timeout: Any, max_bytes: Any, name: Any,
               worker_init: Any) -> None:
        self._fixed_workers = _check_workers(workers)
        if seed is not None:
            seed = _check_int("seed", seed, 0, (1 << 128) - 1)
        ordered = _check_bool("ordered", ordered)
        depth = _check_int("depth", depth, 1, MAX_DEPTH)
        self._timeout = _check_timeout(timeout)
        cap = 0 if max_bytes is None else _check_int("max_bytes", max_bytes, 1, MAX_BYTES)
        worker_init = _check_callable("worker_init", worker_init)
        if name is None:
            name = f"loader-{next(_names)}"
        elif not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r} ({type(name).__name__})")
        delivery = None if device is None else adapters._open_device(device)
        # Without a seed the runs differ, but sample_rng() still gives each
        # sample its own stream.
        self._seed = int.from_bytes(os.urandom(16), "little") if seed is None else seed
        pool = _Pool()
        self._thread_states = adapters._capture_thread_states()
        self._stage = _MapStage(load, mode, collate, pool, name, worker_init, self._seed, ordered, depth,
                                self._thread_states)
        self._owned = (self._stage, pool) if delivery is None else (self._stage, delivery, pool)
        if self._fixed_workers is None:
            # Past the CPUs only while the threads leave CPUs idle (waiting on I/O).
            self._stage.set_auto(AUTO_MAX_THREADS, _usable_cpus())
        self._mode = mode
        self._name = name
        self._core_options = (depth, 1, cap, name, delivery, True, pool, mode == MAP_STACK)
        self._remember_caller()

    # -- per epoch ----------------------------------------------------------

    def _keys(self, epoch: int) -> tuple[Iterator[list[Any]], int, int]:
        """The epoch's batches of keys, the key range (-1: any key) and the rows per batch."""
        raise NotImplementedError

    def _threads(self) -> int:
        return self._fixed_workers or 0   # 0: the stage's own choice (auto)

    def _next_epoch(self) -> _Core:
        if self._closing:
            raise ClosedError(f"{self._kind} {self._name!r} is closed")
        old = self._core
        if old is not None:
            old.close()
        batches, n_keys, rows = self._keys(self._epoch)
        gen = self._stage.start_epoch(batches, self._epoch, n_keys, self._threads(), rows)
        self._epoch += 1
        core = _Core(_EpochSource(self._stage, gen), *self._core_options,
                     wake=functools.partial(self._stage.abandon, gen), describe=self._stage.describe)
        self._install(core, self._thread_states)
        return core

    def _first_core(self) -> _Core:
        return self._next_epoch()

    def __iter__(self) -> Any:
        core = self._core
        if core is None or core.state != "running" or core.stats()["consumed"]:
            self._next_epoch()
        return self

    # -- lifecycle ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once ``close()`` has run."""
        return self._closing

    def stats(self) -> Stats:
        """A frozen snapshot: the current epoch's batch counters and the
        threads' counters over every epoch (see ``prefetch.Stats``)."""
        core = self._core
        counts = core.stats() if core is not None else dict(
            produced=0, consumed=0, bytes_copied=0, consumer_wait_s=0.0, producer_wait_s=0.0,
            fill=0, peak_fill=0, depth=self._core_options[0], blocks_allocated=0, blocks_reused=0)
        return Stats(**counts, **self._stage.stats())

    def __enter__(self) -> Any:
        return self

    def __repr__(self) -> str:
        core = self._core
        state = "closed" if self._closing else ("not started" if core is None else core.state)
        return (f"<{type(self).__name__} name={self._name!r} workers={self._stage.threads} "
                f"epoch={self._epoch - 1} state={state}>")


class Loader(_Threaded, Generic[T]):
    """Load ``dataset[i]`` on several threads and hand out whole batches, as
    fresh arrays that nothing else can reach.

    Each epoch (each ``for`` loop over the loader) reads the sampler's indices
    in order, calls ``dataset[i]`` on ``workers`` threads at once and, with
    the default collate, copies every sample's arrays straight into its row of
    a pooled batch, without the GIL, before that thread loads another sample.
    Batches come out in sampler order (``ordered=False``: as they complete),
    the same for every ``workers`` value.

    ``dataset[i]`` runs on several threads at once: the dataset must allow
    that (most do: in-memory data, files opened per call, decoders). One that
    reads through a single shared handle (an open file, a database cursor)
    must open one per thread, e.g. lazily in a ``threading.local``, or through
    ``worker_init``. The global random generators (``random``, ``np.random``, a
    framework's) are shared by the threads, so what they draw depends on
    timing: draw augmentations from ``prefetch.sample_rng()`` instead.

    Parameters
    ----------
    dataset : object with ``__getitem__`` and ``__len__``
        A list, a numpy array, a framework's map-style dataset...
    batch_size : int or None, default 1
        Samples per batch; None hands out every sample on its own (no collate).
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
        Threads calling ``dataset[i]``. "auto" starts with one and doubles
        them while the consumer waits for batches and a measured gain
        follows, up to the CPUs this process may use, or beyond while those
        stay idle (samples waiting on I/O); fewer when more do not help (a
        dataset that holds the GIL). ``stats().workers`` shows the count.
    collate : callable(list of samples) -> batch, optional
        Replaces the default collate; runs on a loader thread, and its result
        is handed out like a ``Prefetcher`` batch (copied unless only it holds
        its arrays).
    seed : int, optional
        Makes the shuffle and ``prefetch.sample_rng()`` reproducible.
    ordered : bool, default True
    depth, device, timeout, max_bytes, name
        As for ``Prefetcher``.
    worker_init : callable(worker_id), optional
        Called once on each loader thread before its first sample.

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
                 worker_init: Optional[Callable[[int], Any]] = None) -> None:
        cls = type(dataset)
        if not (hasattr(cls, "__getitem__") and hasattr(cls, "__len__")):
            raise TypeError(f"dataset must have __getitem__ and __len__, got {dataset!r} ({cls.__name__}); "
                            "for an iterable, use prefetch.map(fn, iterable) or Prefetcher")
        shuffle = _check_bool("shuffle", shuffle)
        drop_last = _check_bool("drop_last", drop_last)
        if batch_size is not None:
            batch_size = _check_int("batch_size", batch_size, 1, 1 << 62)
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
        collate = _check_callable("collate", collate)
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.drop_last = drop_last
        self.shuffle = shuffle
        if batch_size is None and batch_sampler is None:
            mode = MAP_SINGLE
        else:
            mode = MAP_STACK if collate is None else MAP_CUSTOM
        self._setup(dataset.__getitem__, mode, collate, workers, seed, ordered, depth, device, timeout,
                    max_bytes, name, worker_init)

    def _keys(self, epoch: int) -> tuple[Iterator[list[Any]], int, int]:
        n = len(self.dataset)
        if self.batch_sampler is not None:
            _tell_epoch(self.batch_sampler, epoch)
            return iter(self.batch_sampler), n, 1
        if self.sampler is not None:
            _tell_epoch(self.sampler, epoch)
            keys: Iterator[Any] = iter(self.sampler)
        elif self.shuffle:
            keys = iter(np.random.default_rng([self._seed, epoch]).permutation(n).tolist())
        else:
            keys = iter(range(n))
        if self.batch_size is None:
            return ([k] for k in keys), n, 1
        return _chunks(keys, self.batch_size, self.drop_last), n, self.batch_size

    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(self.batch_sampler)  # type: ignore[arg-type]
        if self.sampler is not None:
            if not isinstance(self.sampler, Sized):
                raise TypeError(f"the sampler of {self!r} has no len()")
            n = len(self.sampler)
        else:
            n = len(self.dataset)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    if TYPE_CHECKING:
        def __next__(self) -> T: ...
        def __enter__(self) -> "Loader[T]": ...


class _Mapped(_Threaded, Generic[T]):
    """What ``prefetch.map`` returns."""

    def __init__(self, fn: Callable[[Any], T], iterable: Iterable[Any], workers: Any, ordered: bool,
                 depth: int, timeout: Optional[float], name: Optional[str],
                 worker_init: Optional[Callable[[int], Any]]) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r} ({type(fn).__name__})")
        try:
            items = iter(iterable)
        except TypeError:
            raise TypeError(f"iterable must be iterable, got {iterable!r} ({type(iterable).__name__})") from None
        # A one-shot iterator is read once; a re-iterable one again each epoch.
        self._items: Optional[Iterator[Any]] = items
        self._iterable = None if items is iterable else iterable
        self._setup(fn, MAP_SINGLE, None, workers, None, ordered, depth, None, timeout, None, name,
                    worker_init)

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
        if not isinstance(self._iterable, Sized):
            raise TypeError(f"the iterable of {self!r} has no len()")
        return len(self._iterable)

    if TYPE_CHECKING:
        def __next__(self) -> T: ...


def map(fn: Callable[[Any], T], iterable: Iterable[Any], *, workers: Any = "auto", ordered: bool = True,
        depth: int = 4, timeout: Optional[float] = None, name: Optional[str] = None,
        worker_init: Optional[Callable[[int], Any]] = None) -> _Mapped[T]:
    """``fn(item)`` for each item of ``iterable``, on ``workers`` threads.

    Results come out in order (``ordered=False``: as they complete), each
    handed out like a ``Prefetcher`` batch: copied unless only it holds its
    arrays. ``iterable`` itself is read by one thread at a time. The result is
    an iterator with ``close()``, ``with``, ``stats()`` and the same error and
    memory rules as ``Loader``.
    """
    return _Mapped(fn, iterable, workers, ordered, depth, timeout, name, worker_init)
