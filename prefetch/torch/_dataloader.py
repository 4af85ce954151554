"""``prefetch.torch.DataLoader``: ``torch.utils.data.DataLoader`` on threads.

It *is* a ``torch.utils.data.DataLoader`` (a subclass): torch's own
constructor validates every argument (same exception types and messages),
builds the samplers (``RandomSampler`` with ``generator``,
``SequentialSampler``, ``BatchSampler``), sets the attributes, and gives
``len()``, ``DataLoader[T]`` and the persistent-workers logic. Only the
iterator differs: ``num_workers`` threads of a ``prefetch.Loader`` (map-style
datasets) or of a ``prefetch.map`` (``IterableDataset``) instead of processes.

Threading contract: ``_InitThread.__call__``, ``_Batches._read``, ``_OneSample``
and ``_Shard.run`` run on loader threads; ``get_worker_info`` anywhere;
everything else on the consumer's thread.
"""
from __future__ import annotations

import collections.abc
import copy
import random
import threading
import warnings
import weakref
from typing import Any, TypeVar

import numpy as np
from torch.utils.data import IterableDataset, default_collate
from torch.utils.data._utils.pin_memory import pin_memory as _pin
from torch.utils.data._utils.worker import _RNG, WorkerInfo

from prefetch import ClosedError, Loader
from prefetch import map as prefetch_map
from prefetch.torch._torch import torch

__all__ = ["DataLoader", "get_worker_info"]

_T_co = TypeVar("_T_co", covariant=True)
_local = threading.local()   # .info on the threads of our loaders (None when num_workers=0)
_NOTHING = object()          # a shard's task that found its iterator already ended
_REPLICAS = ("For multiprocessing data-loading, this could be caused by not properly configuring the "
             "IterableDataset replica at each worker. Please see "
             "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")


def get_worker_info() -> WorkerInfo | None:
    """torch's ``WorkerInfo`` (id, num_workers, seed, dataset, rng) of the
    loader thread calling it, as ``torch.utils.data.get_worker_info()`` gives
    it in a worker process; None on any other thread, and with
    ``num_workers=0`` (torch loads in the main process then).

    ``rng`` holds per-thread ``random.Random``, ``torch.Generator`` and
    ``numpy.random.Generator`` seeded with ``seed``: a thread cannot reseed
    the process-wide generators as a worker process does. Called outside
    these threads it returns what ``torch.utils.data.get_worker_info()``
    returns, so a dataset using it also works in torch's own DataLoader.
    """
    try:
        return _local.info
    except AttributeError:
        return torch.utils.data.get_worker_info()


def _worker_info(worker_id: int, num_workers: int, base_seed: int, dataset: Any) -> WorkerInfo | None:
    if num_workers == 0:
        return None
    seed = base_seed + worker_id   # torch's per-worker seed
    rng = _RNG(random_generator=random.Random(seed),
               torch_generator=torch.Generator().manual_seed(seed),
               numpy_generator=np.random.default_rng([worker_id, base_seed & 0xFFFFFFFFFFFFFFFF]))
    return WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset, rng=rng,
                      worker_method="thread")


class _Batches:
    """The index batches of a torch epoch, as the Loader's batch sampler.

    Seen only as an iterable: the Loader calls ``set_epoch`` on a sampler that
    has one, and torch's DataLoader never does (the user does). It remembers
    the batches the Loader has read and not handed out yet: after a batch's
    error the Loader's epoch ends, and torch's goes on with the next batch, so
    the next Loader epoch replays those batches, then reads on.
    """

    def __init__(self, sampler: Any, single: bool) -> None:
        self.sampler = sampler
        self.single = single          # batch_size=None: each index is a batch of its own
        self.lock = threading.Lock()  # the Loader's threads read; the consumer hands out
        self.restart()

    def restart(self) -> None:
        """A new torch epoch: a new iteration of the sampler."""
        with self.lock:
            self.source = ([i] for i in self.sampler) if self.single else iter(self.sampler)
            self.pending: collections.deque[Any] = collections.deque()  # read, not handed out
            self.unread: collections.deque[Any] = collections.deque()   # to replay first
            self.reader: object = None
            self.failed = False       # the sampler raised: the epoch cannot go on

    def __iter__(self) -> Any:
        """A Loader epoch: replays what no earlier one handed out, then reads on."""
        with self.lock:
            token = self.reader = object()
            self.unread = collections.deque([*self.pending, *self.unread])
            self.pending.clear()
        return self._read(token)

    def _read(self, token: object) -> Any:
        while True:
            with self.lock:
                if self.reader is not token:
                    return            # a later Loader epoch reads now
                if self.unread:
                    keys = self.unread.popleft()
                else:
                    try:
                        keys = next(self.source)
                    except StopIteration:
                        return
                    except BaseException:
                        self.failed = True
                        raise
                self.pending.append(keys)
            yield keys

    def handed_out(self) -> None:
        """The oldest pending batch reached the consumer (or failed there)."""
        with self.lock:
            self.pending.popleft()

    def __len__(self) -> int:
        return len(self.sampler)


class _OneSample:
    """collate for batch_size=None: torch applies collate_fn to the sample itself."""

    def __init__(self, collate_fn: Any) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: list[Any]) -> Any:
        return self.collate_fn(samples[0])


class _InitThread:
    """A Loader's worker_init: torch's WorkerInfo for the thread, then the
    user's ``worker_init_fn(worker_id)`` (not called when num_workers=0, as in
    torch)."""

    def __init__(self, num_workers: int, base_seed: int, dataset: Any, worker_init_fn: Any) -> None:
        self.num_workers = num_workers
        self.base_seed = base_seed
        self.dataset = dataset
        self.worker_init_fn = worker_init_fn

        self.failed = False   # worker_init_fn raised: that thread is gone, the epoch cannot go on

    def __call__(self, worker_id: int) -> None:
        _local.info = _worker_info(worker_id, self.num_workers, self.base_seed, self.dataset)
        if self.worker_init_fn is not None and self.num_workers > 0:
            try:
                self.worker_init_fn(worker_id)
            except BaseException:
                self.failed = True
                raise


class _Shard:
    """One worker's replica of an IterableDataset, as a worker process holds
    it: a shallow copy of the dataset (so that ``worker_init_fn`` may
    configure ``get_worker_info().dataset`` for this worker alone), its own
    ``iter()``, its WorkerInfo. Its tasks are numbered; task j waits for task
    j - 1, so the replica is iterated by one thread at a time, in order."""

    def __init__(self, worker_id: int, loader: DataLoader, base_seed: int) -> None:
        n = loader.num_workers
        self.id = worker_id
        self.dataset = copy.copy(loader.dataset) if n > 0 else loader.dataset
        self.info = _worker_info(worker_id, n, base_seed, self.dataset)
        self.worker_init_fn = loader.worker_init_fn if n > 0 else None
        self.batch_size = loader.batch_size
        self.drop_last = loader.drop_last
        self.collate_fn = loader.collate_fn
        self.initialized = False   # worker_init_fn has run
        self.turn = threading.Condition()
        self.reset()

    def reset(self) -> None:
        """A new epoch (persistent workers keep the replica and skip worker_init_fn)."""
        self.iterator: Any = None
        self.ended = False
        self.issued = 0       # tasks handed to the map
        self.next_task = 0    # the task whose turn it is
        self.cancelled = False

    def run(self, task: int) -> Any:
        with self.turn:
            self.turn.wait_for(lambda: self.next_task == task or self.cancelled)
            if self.cancelled:
                return _NOTHING
        saved = getattr(_local, "info", _NOTHING)
        _local.info = self.info
        try:
            return self._fetch()
        finally:
            if saved is _NOTHING:
                del _local.info
            else:
                _local.info = saved
            with self.turn:
                self.next_task = task + 1
                self.turn.notify_all()

    def cancel(self) -> None:
        """The epoch ended (end, error, close): a task waiting for its turn
        returns. A task may wait for one that the loader will never run,
        once an error has ended the epoch."""
        with self.turn:
            self.cancelled = True
            self.turn.notify_all()

    def _fetch(self) -> Any:
        # torch's _IterableDatasetFetcher, one batch.
        if self.ended:
            return _NOTHING
        if self.iterator is None:
            if not self.initialized and self.worker_init_fn is not None:
                self.worker_init_fn(self.id)
            self.initialized = True
            self.iterator = iter(self.dataset)
        if self.batch_size is None:
            try:
                sample = next(self.iterator)
            except StopIteration:
                self.ended = True
                return _NOTHING
            return self.collate_fn(sample)
        samples = []
        for _ in range(self.batch_size):
            try:
                samples.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        if not samples or (self.drop_last and len(samples) < self.batch_size):
            self.ended = True
            return _NOTHING
        return self.collate_fn(samples)


def _tasks(shards: list[_Shard]) -> Any:
    """Tasks round-robin over the shards still running, as torch hands
    indices to its workers; a task given to a shard that has ended meanwhile
    yields nothing, so the batches come out in torch's order."""
    while True:
        live = [s for s in shards if not s.ended]
        if not live:
            return
        for s in live:
            yield s, s.issued
            s.issued += 1


def _run_task(task: tuple[_Shard, int]) -> Any:
    shard, number = task
    return shard.run(number)


class DataLoader(torch.utils.data.DataLoader[_T_co]):
    """``torch.utils.data.DataLoader`` with the same signature, the same
    batches and the same errors for bad arguments, loading on threads:
    ``num_workers`` threads (0: one thread, with ``get_worker_info()`` None and
    no ``worker_init_fn``, as torch's main-process loading).

    The dataset is shared by the threads, not pickled: a dataset holding
    locks, open files, generators, weak references or ``multiprocessing``
    objects works, and ``dataset[i]`` must allow being called by several
    threads at once. An ``IterableDataset`` is iterated once per worker, each
    worker holding a shallow copy of it; it shards itself through
    ``prefetch.torch.get_worker_info()`` (``torch.utils.data.get_worker_info()``
    returns None in a thread). One that ignores it yields every sample
    ``num_workers`` times, as with torch's processes.

    Differences from torch's:
    - an exception from the dataset, ``collate_fn`` or ``worker_init_fn`` is
      raised as the same object with its own traceback and a note naming the
      sample and the thread (torch re-raises a copy with the worker's traceback
      as text); after a map-style dataset's or ``collate_fn``'s error, ``next()``
      goes on with the next batch, as torch's does (with ``in_order=True``);
      any other error ends the epoch;
    - a map-style dataset needs ``__len__``, and its sampler must give int
      indices in ``range(len(dataset))``;
    - ``timeout`` also applies with ``num_workers=0``; on expiry it raises
      torch's ``RuntimeError('DataLoader timed out after N seconds')`` (from a
      ``TimeoutError`` naming the batch waited for);
    - ``pin_memory``: batches are pinned on the consumer's thread when an
      accelerator is available (torch pins on a thread of its own); without
      one it warns as torch does and does nothing;
    - ``prefetch_factor``: ``prefetch_factor * max(num_workers, 1)`` batches
      are prepared ahead; ``in_order=False``: batches come out as they
      complete; ``persistent_workers``: the threads (with an IterableDataset,
      each worker's replica) are kept across epochs, and ``worker_init_fn``
      runs once;
    - ``multiprocessing_context`` is validated as torch does and then ignored;
      more threads than CPUs draw no warning (they cost little);
    - seeds: each thread's ``get_worker_info().seed`` is torch's
      ``base_seed + worker_id``, drawn from ``generator`` (or torch's global
      generator) as torch draws it, so a shuffled order is the one torch gives
      for the same seed; the process-wide ``random``/``torch``/``numpy``
      generators are not reseeded per thread (they are shared): use
      ``get_worker_info().rng``.
    ``close()`` (or ``with``) releases persistent threads at once; otherwise
    they go with the DataLoader.
    """

    def _get_iterator(self) -> _ThreadIter:
        return _ThreadIter(self)

    def check_worker_number_rationality(self) -> None:
        """torch warns when num_workers exceeds the CPUs, about processes;
        threads waiting on I/O beyond the CPU count are cheap: no warning."""

    def close(self) -> None:
        """Stops the persistent threads, if any (idempotent). An iteration in
        progress raises ``prefetch.ClosedError``."""
        it = self._iterator
        if isinstance(it, _ThreadIter):
            it.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _as_torch(batch: Any) -> Any:
    """A Loader-collated batch as torch's default_collate gives it: numpy
    arrays as tensors over the same memory, tuples as lists (torch's
    backwards compatibility); namedtuples, dicts, lists and strings kept."""
    t = type(batch)
    if t is np.ndarray:
        return torch.from_numpy(batch)
    if t is dict:
        return {k: _as_torch(v) for k, v in batch.items()}
    if t is list or t is tuple:
        return [_as_torch(v) for v in batch]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return t(*(_as_torch(v) for v in batch))
    if isinstance(batch, collections.abc.Mapping):
        return t({k: _as_torch(v) for k, v in batch.items()})
    return batch


class _ThreadIter:
    """One epoch (or, with persistent workers, every epoch) of a DataLoader."""

    def __init__(self, loader: DataLoader) -> None:
        if loader.pin_memory and loader.pin_memory_device:
            warnings.warn("pin_memory_device is deprecated, the current accelerator will be used as the "
                          f"device,ignore pin_memory_device='{loader.pin_memory_device}'.", stacklevel=3)
        self._pin = loader.pin_memory and torch.accelerator.is_available()
        if loader.pin_memory and not self._pin:
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device "
                          "pinned memory won't be used.", stacklevel=3)
        accelerator = torch.accelerator.current_accelerator() if self._pin else None
        self._pin_device = accelerator.type if accelerator is not None else None
        self._timeout = loader.timeout
        self._dataset = loader.dataset
        self._index_sampler = loader._index_sampler
        self._iterable = isinstance(loader.dataset, IterableDataset)
        self._num_workers = loader.num_workers
        self._persistent = loader.persistent_workers and loader.num_workers > 0
        self._ordered = loader.in_order
        threads = max(loader.num_workers, 1)
        options = dict(workers=threads, ordered=loader.in_order,
                       depth=(loader.prefetch_factor or 2) * threads,
                       timeout=loader.timeout or None, name="torch-DataLoader")
        # Drawn as torch draws it, before the sampler runs: the same generator
        # state gives the same shuffle as torch's.
        base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
        self._shards: list[_Shard] = []
        self._batches: _Batches | None = None
        self._init: _InitThread | None = None
        if self._iterable:
            self._shards = [_Shard(w, loader, base_seed) for w in range(threads)]
            self._source: Any = _ShardMap(self._shards, options)
        else:
            auto = loader._auto_collation
            self._batches = _Batches(self._index_sampler, single=not auto)
            self._init = _InitThread(loader.num_workers, base_seed, loader.dataset, loader.worker_init_fn)
            # torch's default_collate: the Loader's own collate gives the same batches,
            # each sample copied once into its row (torch stacks a list, then copies
            # again into shared memory); _as_torch turns its numpy leaves into tensors.
            self._convert = auto and loader.collate_fn is default_collate
            collate = None if self._convert else loader.collate_fn if auto else _OneSample(loader.collate_fn)
            self._source = Loader(loader.dataset, batch_sampler=self._batches, collate=collate,
                                  worker_init=self._init, **options)
        # torch's iterators have no close(): one dropped mid-epoch closes its loader.
        weakref.finalize(self, self._source.close)
        self._resume = self._done = False
        self._convert = getattr(self, "_convert", False)
        self._yielded = 0
        self._epoch: Any = None
        self._reset(loader)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        """An epoch begins (torch calls it again for each epoch of persistent
        workers: same threads, same replicas)."""
        self._len_called = loader._IterableDataset_len_called
        if self._epoch is not None and not self._yielded and not self._done and not self._resume:
            return   # nothing taken from the epoch begun: it is this one
        self._yielded = 0
        self._done = self._resume = False
        if self._batches is not None:
            self._batches.restart()
        self._epoch = iter(self._source)

    def __iter__(self) -> _ThreadIter:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._resume:   # after a batch's error, go on with the next batch, as torch does
            self._resume = False
            self._epoch = iter(self._source)
        try:
            batch = next(self._epoch)
            while batch is _NOTHING:
                batch = next(self._epoch)
        except TimeoutError as exc:   # the epoch goes on: next() waits again
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from exc
        except StopIteration:
            self._end(close=not self._persistent)
            raise
        except Exception as exc:
            # The Loader's epoch ended with this batch's error (the loader is not
            # closed while the error is on its way: the weakref finalizer closes
            # it with this iterator).
            if self._goes_on(exc):
                self._batches.handed_out()   # type: ignore[union-attr]
                self._resume = True
            else:
                self._end(close=False)
            raise
        except BaseException:
            self._end(close=False)
            raise
        if self._batches is not None:
            self._batches.handed_out()
        self._yielded += 1
        if self._iterable and self._len_called is not None and self._yielded > self._len_called:
            warnings.warn(f"Length of IterableDataset {self._dataset} was reported to be {self._len_called}"
                          f"(when accessing len(dataloader)), but {self._yielded} samples have been "
                          "fetched. " + _REPLICAS * (self._num_workers > 0), stacklevel=2)
        if self._convert:
            batch = _as_torch(batch)
        if self._pin:
            batch = _pin(batch, self._pin_device)
        return batch

    def _goes_on(self, exc: Exception) -> bool:
        """Whether the epoch can go on after ``exc``: a map-style dataset's or
        collate_fn's error for the batch due now (in order); not the sampler's,
        nor a worker_init_fn's (that thread is gone), nor an IterableDataset's."""
        return (self._batches is not None and self._init is not None and self._ordered
                and not isinstance(exc, ClosedError) and not self._batches.failed
                and not self._init.failed)

    def _end(self, close: bool) -> None:
        """The epoch is over: tasks waiting for their turn return; threads go if ``close``."""
        self._done = True
        for s in self._shards:
            s.cancel()
        if close:
            self._source.close()

    def close(self) -> None:
        self._end(close=True)


class _ShardMap:
    """The IterableDataset's loader: a ``prefetch.map`` over the shards'
    tasks, started afresh for each epoch (iterating it again starts the next
    one, as iterating a Loader again does)."""

    def __init__(self, shards: list[_Shard], options: dict[str, Any]) -> None:
        self.shards = shards
        self.options = options
        self.map: Any = None

    def __iter__(self) -> Any:
        self.close()
        for s in self.shards:
            s.reset()
        self.map = prefetch_map(_run_task, _tasks(self.shards), **self.options)
        return iter(self.map)

    def close(self) -> None:
        if self.map is not None:
            for s in self.shards:
                s.cancel()
            self.map.close()
            self.map = None
