"""``prefetch.torch.DataLoader``: ``torch.utils.data.DataLoader`` on threads.

It *is* a ``torch.utils.data.DataLoader`` (a subclass): torch's own
constructor validates every argument (same exception types and messages),
builds the samplers (``RandomSampler`` with ``generator``,
``SequentialSampler``, ``BatchSampler``), sets the attributes, and gives
``len()``, ``DataLoader[T]`` and the persistent-workers logic. Only the
iterator differs: ``num_workers`` threads of a ``prefetch.Loader`` (map-style
datasets) or of a ``prefetch.map`` (``IterableDataset``: ``_shards.py``)
instead of processes; each thread is a worker (``_worker.py``).

Threading contract: ``_Batches._take`` and ``_OneSample`` run on loader
threads (and what ``_worker.py`` and ``_shards.py`` say); everything else
on the consumer's thread.
"""
from __future__ import annotations

import base64
import collections.abc
import copy
import inspect
import os
import warnings
import weakref
from typing import Any, TypeVar

import numpy as np
from torch.utils.data import IterableDataset, default_collate
from torch.utils.data._utils.pin_memory import pin_memory as _pin

from prefetch._framework import FrameworkLoader
from prefetch._options import check_num_workers
from prefetch._resume import check_fits
from prefetch._types import ClosedError, Stats
from prefetch.torch._device import PinnedHost
from prefetch.torch._sampler import _Batches
from prefetch.torch._shards import NOTHING, ShardMap
from prefetch.torch._torch import torch
from prefetch.torch._worker import InitThread, get_worker_info, thread_replica

__all__ = ["DataLoader", "get_worker_info"]

_T_co = TypeVar("_T_co", covariant=True)
_REPLICAS = ("For multiprocessing data-loading, this could be caused by not properly configuring the "
             "IterableDataset replica at each worker. Please see "
             "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")


class _OneSample:
    """collate for batch_size=None: torch applies collate_fn to the sample itself."""

    def __init__(self, collate_fn: Any) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: list[Any]) -> Any:
        return self.collate_fn(samples[0])


_TORCH_INIT = inspect.signature(torch.utils.data.DataLoader.__init__)


class DataLoader(torch.utils.data.DataLoader[_T_co]):
    """``torch.utils.data.DataLoader`` with the same signature, the same
    batches and the same errors for bad arguments, loading on threads:
    ``num_workers`` threads (0: one thread, with ``get_worker_info()`` None and
    no ``worker_init_fn``, as torch's main-process loading).

    The dataset is not pickled: a dataset holding locks, open files,
    generators, weak references or ``multiprocessing`` objects works, and
    ``dataset[i]`` must allow being called by several threads at once. Each
    worker thread loads from a shallow copy of its own (and of each torch
    dataset inside it), as each worker process holds a copy: what
    ``dataset[i]`` or ``worker_init_fn`` sets on it (a file opened on first
    use) is that worker's, while the objects it refers to are shared; one
    that cannot be copied is shared; with ``num_workers=0`` the thread loads
    from the dataset itself. An ``IterableDataset`` is iterated once per
    worker, from that worker's copy, by that worker's thread alone (as by
    one worker process: a connection opened in ``__iter__`` works); it
    shards itself through
    ``prefetch.torch.get_worker_info()`` (``torch.utils.data.get_worker_info()``
    returns None in a thread). One that ignores it yields every sample
    ``num_workers`` times, as with torch's processes.

    Differences from torch's:
    - an exception from the dataset, ``collate_fn`` or ``worker_init_fn`` is
      raised as the same object with its own traceback and a note naming the
      sample and the thread (torch re-raises a copy with the worker's traceback
      as text); after a map-style dataset's or ``collate_fn``'s error, ``next()``
      goes on with the next batch, as torch's does;
      any other error ends the epoch;
    - a map-style dataset needs ``__len__`` (its indices are passed to
      ``dataset[...]`` as the sampler gives them, as torch does);
    - ``timeout`` also applies with ``num_workers=0``; on expiry it raises
      torch's ``RuntimeError('DataLoader timed out after N seconds')`` (from a
      ``TimeoutError`` naming the batch waited for);
    - ``pin_memory``: when an accelerator is available, the batches are
      pinned on the loader's publisher thread (as on torch's pin-memory
      thread); without one it warns as torch does and does nothing;
    - ``prefetch_factor``: as in torch, at most ``prefetch_factor *
      num_workers`` batches are loaded ahead of the consumer (with
      ``num_workers=0``, ``prefetch_factor * 1``: torch loads none ahead then); ``in_order=False``: batches come out as they
      complete; ``persistent_workers``: the threads (with an IterableDataset,
      each worker's replica) are kept across epochs, and ``worker_init_fn``
      runs once; the next epoch's first batches (at most ``prefetch_factor *
      num_workers``) load while this one's last are consumed, where its
      order is known ahead: torch's ``SequentialSampler``, or its
      ``RandomSampler`` over a ``generator`` of the loader's own that nothing
      else draws from between epochs (what was loaded early is dropped
      otherwise; torch's global generator is never read ahead); persistent
      workers keep their copies of the dataset, as torch's do;
    - ``multiprocessing_context`` is validated as torch does and then ignored;
      more workers than CPUs draw torch's warning, said of threads;
    - seeds: each thread's ``get_worker_info().seed`` is torch's
      ``base_seed + worker_id``, drawn from ``generator`` (or torch's global
      generator) as torch draws it, so a shuffled order is the one torch gives
      for the same seed; the sampler is read on the consumer's thread, as
      torch's main process reads it (``prefetch_factor * num_workers`` batches
      ahead; with ``num_workers=0``, ``prefetch_factor`` ahead where torch reads
      none), so the generator's later draws do not depend on the threads'
      timing; the process-wide ``random``/``torch``/``numpy``
      generators are not reseeded per thread (they are shared): use
      ``get_worker_info().rng``, or, in a map-style dataset,
      ``prefetch.sample_rng()`` (seeded from torch's base seed: the same
      torch seed gives the same draws, whichever thread loads the sample).
    ``close()`` (or ``with``) releases persistent threads at once; otherwise
    they go with the DataLoader.
    """

    _resume: dict[str, Any] | None = None   # load_state_dict(): what the next epoch continues
    _last: Any = None                        # weakref of the iterator made last

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            given = _TORCH_INIT.bind(self, *args, **kwargs).arguments
        except TypeError:
            given = {}   # a call torch refuses: torch's own __init__ says why, below
        if "num_workers" in given:
            check_num_workers(given["num_workers"])
        super().__init__(*args, **kwargs)
        self._gil_noticed = [False]   # the iterators' GIL notice was given (see _ThreadIter)
        self._ended_stats = [Stats()]   # stats() of the epoch ended last, set by its iterator

    __init__.__signature__ = _TORCH_INIT  # type: ignore[attr-defined]  # torch's, for help() and IDEs


    _closed = False   # close() ran: no epoch starts again

    def _get_iterator(self) -> _ThreadIter:
        if self._closed:
            raise ClosedError("this DataLoader is closed")
        if self.num_workers:
            self.check_worker_number_rationality()   # as torch, for each new iterator (the same depth)
        it = _ThreadIter(self)
        self._last = weakref.ref(it)
        return it

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration is, as torchdata's ``StatefulDataLoader`` gives
        it: a small JSON-serialisable dict (the random generator's states at
        the iterator's and the epoch's start, the batches handed out in the
        epoch, the dataset's length and the batch size). Save it beside a
        model's (``torch.save``) and give it to ``load_state_dict`` of a new
        DataLoader over the same data to continue with the batches an
        uninterrupted run would have handed out next. Map-style datasets
        only; a sampler that draws from torch's global generator other than
        at its start (``RandomSampler`` draws there only) is not restored."""
        if self._resume is not None:
            return dict(self._resume)
        last = self._last() if self._last is not None else None
        if isinstance(self.dataset, IterableDataset):
            raise TypeError("state_dict() is for a map-style dataset; an IterableDataset's position "
                            "is its own to save")
        state = {"format": "prefetch.torch.DataLoader", "version": 1, "dataset_length": len(self.dataset),
                 "batch_size": self.batch_size}
        if last is None or last._epoch_rng is None:
            generator = self.generator if self.generator is not None else torch.default_generator
            rng = _b64(generator.get_state())
            return dict(state, iterator_rng=rng, epoch_rng=None, batches=0)
        if last._done:
            # Ended: the next epoch draws from where the generator is now.
            generator = self.generator if self.generator is not None else torch.default_generator
            rng = _b64(generator.get_state())
            return dict(state, iterator_rng=rng, epoch_rng=None, batches=0)
        return dict(state, iterator_rng=last._iter_rng, epoch_rng=last._epoch_rng, batches=last._handed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next ``iter(loader)`` continues where ``state`` (from
        ``state_dict()``) was taken; ValueError for a state that does not
        fit this DataLoader (it is then unchanged)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from DataLoader.state_dict(), got {type(state).__name__}")
        if state.get("format") != "prefetch.torch.DataLoader" or state.get("version") != 1:
            raise ValueError(f"state is not a version 1 prefetch.torch.DataLoader state (format "
                             f"{state.get('format')!r}, version {state.get('version')!r})")
        keys = ("dataset_length", "batch_size", "iterator_rng", "epoch_rng", "batches")
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"state lacks {', '.join(map(repr, missing))} (truncated or edited?)")
        check_fits("DataLoader", state["dataset_length"], state["batch_size"], len(self.dataset), self.batch_size)
        batches = state["batches"]
        if isinstance(batches, bool) or not isinstance(batches, int) or not 0 <= batches <= len(self):
            raise ValueError(f"state has batches={batches!r}, not a count of this DataLoader's "
                             f"{len(self)} batches (edited?)")
        try:
            for k in ("iterator_rng", "epoch_rng"):
                if state[k] is not None:
                    _unb64(state[k])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"state has a bad generator state (edited?): {exc}") from None
        it = self._iterator
        if isinstance(it, _ThreadIter) and not it._done:
            raise RuntimeError("cannot load a state while an epoch is in progress; load it before "
                               "iterating, or once the epoch has ended")
        self._resume = dict(state)

    def check_worker_number_rationality(self, stacklevel: int = 4) -> None:
        """torch's warning when ``num_workers`` exceeds the CPUs this process
        may use (``torch._utils.cpu_count()``), said of threads: the same
        ``UserWarning``, with torch's wording but "worker threads". It points
        at the user's line from torch's ``__init__`` (under this class's) and
        from ``_get_iterator`` (under torch's ``__iter__``): 4 frames up."""
        if not self.num_workers:
            return
        cpus = torch._utils.cpu_count()
        if cpus is not None and self.num_workers <= cpus:
            return
        if cpus is None:
            suggested = "DataLoader is not able to compute a suggested max number of worker in current system."
        else:
            cpuset = "" if hasattr(os, "sched_getaffinity") else " (`cpuset` is not taken into account)"
            suggested = (f"Our suggested max number of worker in current system is {cpus}{cpuset}, which is "
                         "smaller than what this DataLoader is going to create.")
        warnings.warn(f"This DataLoader will create {self.num_workers} worker threads in total. {suggested} "
                      "Please be aware that excessive worker creation might get DataLoader running slow or "
                      "even freeze, lower the worker number to avoid potential slowness/freeze if necessary.",
                      UserWarning, stacklevel=stacklevel)

    def stats(self) -> Stats:
        """The counters of the epoch begun last, as ``prefetch.Loader.stats()``
        gives them (a ``prefetch.Stats``: its batches, the threads' time inside
        ``dataset[i]``, ``load_parallelism``...); all zero before the first epoch."""
        last = self._last() if self._last is not None else None
        if isinstance(last, _ThreadIter) and not last._done:
            return last._source.stats()  # type: ignore[no-any-return]
        return self._ended_stats[0]

    def close(self) -> None:
        """Stops its threads at once, persistent or not (idempotent): an
        iteration in progress raises ``prefetch.ClosedError`` at its next
        ``next()``, as does a new one."""
        self._closed = True
        last = self._last() if self._last is not None else None
        for it in (self._iterator, last):   # persistent workers' iterator; the epoch begun last
            if isinstance(it, _ThreadIter):
                it.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _b64(state: Any) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> Any:
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)


def _leaf_collection(obj: Any) -> bool:
    """A collection the Loader keeps whole (a leaf) and torch's
    default_collate takes apart: a Mapping that is no dict (a ``UserDict``,
    a read-only ``Mapping``), a Sequence that is no list, tuple or string
    (a ``range``, a ``UserList``)."""
    if isinstance(obj, collections.abc.Mapping):
        return not isinstance(obj, dict)
    return isinstance(obj, collections.abc.Sequence) and not isinstance(obj, (list, tuple, str, bytes))


_NODES = (list, tuple, dict, np.ndarray)


def _item(child: Any) -> Any:
    """A child of a sequence node: a column of objects (no node, no array
    among them: strings...) as the tuple torch gives; anything else converted."""
    if type(child) is list and child and not any(isinstance(v, _NODES) or _leaf_collection(v) for v in child):
        return tuple(child)
    return _as_torch(child)


def _as_torch(batch: Any) -> Any:
    """A Loader-collated batch as torch's default_collate gives it: numpy
    arrays as tensors over the same memory, tuples as lists (torch's
    backwards compatibility); namedtuples, dicts, lists and strings kept.

    Mappings keep their type as torch's do: a dict subclass (which the
    Loader rebuilds as a node) through ``copy.copy(batch).update(...)``, or
    its constructor when immutable, else a dict. Any other Mapping (a
    ``UserDict``, a read-only ``Mapping``) is a leaf to the Loader, so its
    column is the list of the samples' own objects: torch's default_collate
    stacks that list here, on the consumer's thread. Sequences likewise: a
    list subclass keeps its type (``copy.copy(batch)`` refilled, as torch),
    a tuple subclass becomes a list, and any other Sequence (a ``range``) is
    a leaf stacked by torch's default_collate. Inside a sequence, a column of
    strings (or other objects) is a tuple, as torch's ``zip(*batch)`` gives
    it; elsewhere a list."""
    t = type(batch)
    if t is np.ndarray:
        return torch.from_numpy(batch)
    if t is dict:
        return {k: _as_torch(v) for k, v in batch.items()}
    if t is list and batch and all(_leaf_collection(v) for v in batch):
        # A leaf collection is one to the Loader: only a column holds those.
        return default_collate(batch)
    if t is list or t is tuple:
        return [_item(v) for v in batch]
    if isinstance(batch, tuple):
        if hasattr(batch, "_fields"):
            return t(*(_item(v) for v in batch))
        return [_item(v) for v in batch]
    if isinstance(batch, list):   # a subclass, rebuilt by the Loader with its type
        converted = [_item(v) for v in batch]
        try:
            clone = copy.copy(batch)
            for i, v in enumerate(converted):
                clone[i] = v
            return clone
        except TypeError:   # as torch
            return converted
    if isinstance(batch, collections.abc.Mapping):
        items = {k: _as_torch(v) for k, v in batch.items()}
        try:
            if isinstance(batch, collections.abc.MutableMapping):
                clone = copy.copy(batch)
                clone.update(items)
                return clone
            return t(items)
        except TypeError:   # as torch: no copy()/update(mapping)/__init__(mapping)
            return items
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
        self._ended_stats = loader._ended_stats   # its stats() once it ends, for the DataLoader's
        self._dataset = loader.dataset
        self._index_sampler = loader._index_sampler
        self._iterable = isinstance(loader.dataset, IterableDataset)
        self._num_workers = loader.num_workers
        self._persistent = loader.persistent_workers and loader.num_workers > 0
        threads = max(loader.num_workers, 1)
        # torch's bound: at most prefetch_factor * num_workers batches loaded
        # (or loading) that the consumer has not taken.
        self._ahead = (loader.prefetch_factor or 2) * threads
        options = dict(workers=threads, ordered=loader.in_order, depth=self._ahead,
                       timeout=loader.timeout or None, name="torch-DataLoader")
        # Drawn as torch draws it, before the sampler runs: the same generator
        # state gives the same shuffle as torch's. A resumed state sets the
        # generator to where it was (torch's global one only for the draw).
        self._generator = loader.generator if loader.generator is not None else torch.default_generator
        resume = loader._resume
        users = None
        if resume is not None and loader.generator is None:
            users = torch.default_generator.get_state()
        if resume is not None:
            self._generator.set_state(_unb64(resume["iterator_rng"]))
        self._iter_rng = _b64(self._generator.get_state())
        self._epoch_rng: str | None = None
        self._handed = self._skipped = 0   # batches of the epoch handed out (or failed), and skipped
        base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
        if users is not None:
            torch.default_generator.set_state(users)
        self._batches: _Batches | None = None
        if self._iterable:
            self._source: Any = ShardMap(loader, options, self._ahead, base_seed,
                                         device=PinnedHost() if self._pin else None)
        else:
            auto = loader._auto_collation
            self._batches = _Batches(self._index_sampler, single=not auto)
            init = InitThread(loader.num_workers, base_seed, loader.dataset, loader.worker_init_fn)
            # torch's default_collate: the Loader's own collate gives the same batches,
            # each sample copied once into its row (torch stacks a list, then copies
            # again into shared memory); _as_torch turns its numpy leaves into tensors.
            self._convert = auto and loader.collate_fn is default_collate
            collate = None if self._convert else loader.collate_fn if auto else _OneSample(loader.collate_fn)
            # torch's base_seed seeds prefetch.sample_rng(): the same torch seed, the same draws.
            # A batch's error is that batch's; the epoch goes on (torch's does).
            # Pinned on the publisher thread, as on torch's pin-memory thread;
            # what only torch's pin_memory() knows (an object's own) on the consumer's.
            # Each thread loads from a copy of its own, as each worker process (not with
            # num_workers=0: torch's main process loads from the dataset itself).
            per_thread = thread_replica if loader.num_workers > 0 else None
            # One GIL notice per DataLoader, though each epoch without persistent workers
            # has a Loader of its own.
            self._gil_noticed = loader._gil_noticed
            self._source = FrameworkLoader(loader.dataset, batch_sampler=self._batches, collate=collate,
                                           per_thread=per_thread, worker_init=init, seed=base_seed,
                                           lookahead=self._ahead, go_on=True, gil_noticed=self._gil_noticed[0],
                                           device=PinnedHost() if self._pin else None,
                                           remedy="torch.utils.data.DataLoader(dataset, num_workers=N)",
                                           **options)
        # torch's iterators have no close(): one dropped mid-epoch closes its loader.
        weakref.finalize(self, self._source.close)
        self._done = False
        self._convert = getattr(self, "_convert", False)
        self._yielded = self._taken = 0   # batches of the epoch handed out; and failed too
        self._epoch: Any = None
        self._reset(loader)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        """An epoch begins (torch calls it again for each epoch of persistent
        workers: same threads, same replicas)."""
        self._len_called = loader._IterableDataset_len_called
        if self._closed:
            raise ClosedError("this DataLoader is closed")
        if self._epoch is not None and not self._taken and not self._done:
            return   # nothing taken from the epoch begun: it is this one
        self._yielded = self._taken = 0
        self._done = False
        if self._batches is not None:
            self._restart(loader)
        self._epoch = iter(self._source)

    def _restart(self, loader: DataLoader) -> None:
        """The sampler's new epoch: its generator state saved first, then its
        first batches read, as torch reads them; with a resumed state,
        restored first, and the batches handed out before skipped."""
        batches = self._batches
        assert batches is not None
        resume, loader._resume = loader._resume, None
        self._handed = self._skipped = 0
        epoch = self._source.next_epoch   # the Loader's epoch this one will be
        if resume is None:
            self._epoch_rng = _b64(self._generator.get_state())
            batches.restart(epoch)
            batches.read_to(self._ahead)
            return
        users = torch.default_generator.get_state() if loader.generator is None else None
        if resume["epoch_rng"] is not None:
            self._generator.set_state(_unb64(resume["epoch_rng"]))
        self._epoch_rng = _b64(self._generator.get_state())
        try:
            batches.restart(epoch, skip=resume["batches"])
            batches.read_to(self._ahead)   # under the restored state
        finally:
            if users is not None:
                torch.default_generator.set_state(users)
        self._handed = self._skipped = resume["batches"]

    def __iter__(self) -> _ThreadIter:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    _closed = False   # close() ran: next() raises ClosedError, never a silent end

    def __next__(self) -> Any:
        if self._closed:
            raise ClosedError("this DataLoader was closed during its epoch")
        if self._done:
            raise StopIteration
        if self._batches is not None:
            # torch reads one batch more for each it hands out: the one due now too.
            self._batches.read_to(self._ahead + self._handed - self._skipped + 1)
        epoch = self._epoch
        failed = epoch.failed_batches
        try:
            batch = next(self._epoch)
            while batch is NOTHING:
                batch = next(self._epoch)
        except TimeoutError as exc:   # the epoch goes on: next() waits again
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from exc
        except StopIteration:
            if self._closed:   # by another thread while this one waited
                raise ClosedError("this DataLoader was closed during its epoch") from None
            self._end(close=not self._persistent)
            raise
        except BaseException as exc:
            if epoch.failed_batches != failed:
                # That batch's own error (a map-style dataset's, collate_fn's):
                # the epoch goes on with the next batch, as torch's does.
                self._handed += 1
                self._taken += 1
            elif not (isinstance(exc, KeyboardInterrupt) and epoch.running):
                # Not Ctrl-C while next() waited (nothing taken: the next
                # next() waits for the same batch, as torch's does): the end.
                self._end(close=False)
            raise
        self._handed += 1
        self._taken += 1
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

    def _end(self, close: bool) -> None:
        """The epoch is over: tasks waiting for their turn return; threads go if ``close``."""
        self._done = True
        self._ended_stats[0] = self._source.stats()
        if self._iterable:
            self._source.cancel()
        else:
            self._gil_noticed[0] = self._gil_noticed[0] or self._source.gil_noticed
        if close:
            self._source.close()

    def close(self) -> None:
        self._closed = True
        self._end(close=True)
