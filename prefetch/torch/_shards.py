"""An IterableDataset on threads, iterated as torch's worker processes iterate it.

Worker w is loader thread w of a ``prefetch.map``: that thread alone runs its
replica (a copy of the dataset, ``worker_init_fn`` once, ``iter()`` each
epoch, every ``next()``), as worker process w does, so a dataset may hold
what only the thread that made it may use (an SQLite connection opened in
``__iter__``, a thread-local set by ``worker_init_fn``). A worker makes at
most ``prefetch_factor`` batches the consumer has not taken from it. The map
hands batches on as they complete; ``_InTurn`` gives them in torch's order:
with ``in_order``, one of each worker still running in turn (a worker's batch
j after batch j of the workers before it), else as they come.

Resuming: after each batch, its worker's thread copies its dataset's and
iterator's own states (where they have ``state_dict()``) and they travel with
the batch; as the consumer takes it, that worker's part of the state becomes
theirs (``_ShardEpoch.parts``), so ``state_dict()`` is each worker as of its
last batch delivered, whatever was loaded ahead. A resumed worker starts its
iterator from its part (``_Shard._start``).

Threading contract: ``_Shard.fetch`` and ``_ShardEpoch.run`` run on loader
threads (thread w on shard w only); ``ShardMap.state_dict`` on any thread
(it reads parts replaced whole); everything else on the consumer's thread.
"""
from __future__ import annotations

import collections
import copy
import functools
import threading
from typing import Any

from prefetch._framework import FrameworkMap, Stats, make_state, replica, set_sample_index
from prefetch.torch._worker import DATASETS, _local, worker_info

NOTHING = object()   # a task that made no batch: its worker had ended, or the epoch was cancelled
_END = object()      # a worker's iterator has ended: its last result of the epoch
_WAIT_SLICE_S = 0.1  # a task waiting for room re-checks that its map is not closing


class _Raised:
    """A worker's error, raised on the consumer's thread at that worker's turn."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


class _Shard:
    """One worker's replica of an IterableDataset, as a worker process holds
    it: a copy of the dataset (``replica()``: so that ``worker_init_fn`` may
    configure ``get_worker_info().dataset`` for this worker alone), its own
    ``iter()`` each epoch, its WorkerInfo. Used by its worker's thread only."""

    def __init__(self, worker_id: int, loader: Any, base_seed: int) -> None:
        n = loader.num_workers
        self.id = worker_id
        self.dataset = _stream_replica(loader.dataset) if n > 0 else loader.dataset
        self.info = worker_info(worker_id, n, base_seed, self.dataset)
        self.worker_init_fn = loader.worker_init_fn if n > 0 else None
        self.batch_size = loader.batch_size
        self.drop_last = loader.drop_last
        self.collate_fn = loader.collate_fn
        self.initialized = False   # worker_init_fn has run (persistent workers run it once)
        self.epoch = -1            # the epoch its iterator is of
        self.iterator: Any = None
        self.resume: Any = None          # a worker's part of a loaded state: its next iterator starts there
        self.own_state = False           # the dataset has a state of its own (not its iterator's)
        self.dataset_state: Any = None   # the dataset's own state at its last batch

    def fetch(self, epoch: int) -> tuple[Any, Any]:
        """The replica's next batch of epoch ``epoch`` (``_END`` once it has
        none), and the state it leaves the worker in (``_snapshot``)."""
        batch = self._next_batch(epoch)
        return batch, self._snapshot()

    def _next_batch(self, epoch: int) -> Any:
        # torch's _IterableDatasetFetcher, one batch.
        _local.info = self.info
        if self.epoch != epoch:
            self.epoch, self.iterator = epoch, None
        if self.iterator is None:
            if not self.initialized and self.worker_init_fn is not None:
                self.worker_init_fn(self.id)
            self.initialized = True
            self._start()
        if self.batch_size is None:
            try:
                sample = next(self.iterator)
            except StopIteration:
                return _END
            return self.collate_fn(sample)
        samples = []
        for _ in range(self.batch_size):
            try:
                samples.append(next(self.iterator))
            except StopIteration:
                break
        if not samples or (self.drop_last and len(samples) < self.batch_size):
            return _END
        if len(samples) < self.batch_size:
            self.iterator = iter(())   # ended: the next fetch says so without calling the dataset
        return self.collate_fn(samples)

    def _start(self) -> None:
        """The epoch's iterator; from a resumed part, as torchdata restores a
        worker: the dataset's own state first, then ``iter()``, then the
        iterator's own state; where neither has one, the batches delivered
        before are read again and dropped."""
        part, self.resume = self.resume, None
        if part is not None and part["dataset"] is not None and stateful(self.dataset):
            self.dataset.load_state_dict(copy.deepcopy(part["dataset"]))
        self.iterator = iter(self.dataset)
        self.own_state = self.iterator is not self.dataset and stateful(self.dataset)
        if part is None:
            return
        if part["iterator"] is not None and stateful(self.iterator):
            self.iterator.load_state_dict(copy.deepcopy(part["iterator"]))
        elif not (self.own_state or stateful(self.iterator)):
            for _ in range(part["batches"]):
                if self._skip_batch():
                    break

    def _skip_batch(self) -> bool:
        """One batch read and dropped (not collated); True once the iterator has ended."""
        for _ in range(1 if self.batch_size is None else self.batch_size):
            try:
                next(self.iterator)
            except StopIteration:
                return True
        return False

    def _snapshot(self) -> tuple[Any, Any]:
        """The dataset's and the iterator's own states now (copies: the next
        batch changes them), where they have ``state_dict()``; the dataset's
        only where it is not its own iterator."""
        it = self.iterator
        dataset = copy.deepcopy(self.dataset.state_dict()) if self.own_state else None
        iterator = copy.deepcopy(it.state_dict()) if it is not None and stateful(it) else None
        self.dataset_state = dataset if self.own_state else self.dataset_state
        return dataset, iterator


def _stream_replica(dataset: Any) -> Any:
    """A worker's copy of a stream: a deep one where it can be made (a
    stream's objects hold its position: a library's shard iterators and
    their state, which each worker process has its own of), else the
    shallow one a map-style dataset's worker has (a lock, an open file)."""
    try:
        return copy.deepcopy(dataset)
    except Exception:
        return replica(dataset, DATASETS)


def stateful(obj: Any) -> bool:
    """torchdata's Stateful protocol: state_dict() and load_state_dict()."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def fresh_part() -> dict[str, Any]:
    """A worker's part of the state at its stream's start."""
    return {"batches": 0, "dataset": None, "iterator": None}


class _ShardEpoch:
    """One epoch of the workers: the map's items are tasks (this object, once
    per batch a worker may make); the thread of worker w runs them as w."""

    def __init__(self, shards: list[_Shard], per_worker: int, number: int, closed: Any,
                 parts: list[dict[str, Any]], turn: int) -> None:
        n = len(shards)
        self.closed = closed       # () -> the map is closing: a waiting task returns (close() joins it)
        self.n = n
        self.per_worker = per_worker
        self.number = number
        # What state_dict() reads: each worker's part as of its last batch
        # delivered (replaced whole on the consumer's thread), the worker due
        # next, and whether the consumer met the epoch's end.
        self.parts = parts
        self.turn = turn
        self.finished = False
        self.made = [p["batches"] for p in parts]    # batches each worker made this epoch (an error counts)
        self.taken = list(self.made)                 # of those, taken by the consumer
        self.ended = [False] * n   # the worker's iterator ended (or raised)
        self.cv = threading.Condition()
        self.cancelled = False

    def tasks(self) -> Any:
        """A task per batch a worker may make, until every worker has ended."""
        while not all(self.ended):
            yield self

    def run(self, shard: _Shard) -> Any:
        """Worker ``shard``'s next batch as (its id, the batch, _END or an error),
        once it has fewer than ``per_worker`` batches not taken; NOTHING when it
        has ended (once every worker has) or the epoch is cancelled."""
        w = shard.id
        with self.cv:
            while not (self.cancelled or self.closed() or (
                    all(self.ended) if self.ended[w] else self.made[w] - self.taken[w] < self.per_worker)):
                self.cv.wait(_WAIT_SLICE_S)
            if self.cancelled or self.closed() or self.ended[w]:
                return NOTHING
        # sample_rng()'s stream: worker w's batch j is the (j * n + w)th in torch's order
        set_sample_index(self.made[w] * self.n + w)
        snapshot = None
        try:
            batch, snapshot = shard.fetch(self.number)
        except Exception as exc:   # raised at the worker's turn; the epoch ends there
            batch = _Raised(exc)
        with self.cv:
            if batch is _END or isinstance(batch, _Raised):
                self.ended[w] = True
            self.made[w] += 1
            self.cv.notify_all()
        return w, batch, snapshot

    def delivered(self, w: int, snapshot: Any) -> None:
        """Worker ``w``'s batch was handed out (consumer's thread): its part
        is now as of that batch."""
        part = self.parts[w]
        dataset, iterator = (None, None) if snapshot is None else snapshot
        self.parts[w] = {"batches": part["batches"] + 1, "dataset": dataset, "iterator": iterator}

    def take(self, w: int) -> None:
        """The consumer took one of worker ``w``'s batches: room for another."""
        with self.cv:
            self.taken[w] += 1
            self.cv.notify_all()

    def cancel(self) -> None:
        """The epoch ended (end, error, close, a new epoch): waiting tasks return NOTHING."""
        with self.cv:
            self.cancelled = True
            self.cv.notify_all()


def _run_as(shard: _Shard, epoch: _ShardEpoch) -> Any:
    return epoch.run(shard)


class _InTurn:
    """The epoch's batches from the map, in torch's order (``ordered``: one
    of each worker still running in turn; else as they come)."""

    def __init__(self, epoch: _ShardEpoch, results: Any, ordered: bool) -> None:
        self.epoch = epoch
        self.results = results
        self.ordered = ordered
        n = epoch.n
        self.held: list[collections.deque[Any]] = [collections.deque() for _ in range(n)]
        self.ended = [False] * n     # the worker's _END has come

    def __iter__(self) -> _InTurn:
        return self

    def __next__(self) -> Any:
        while True:
            if self.ordered:
                w = self._due()
                if w is not None:
                    return self._hand(w, self.held[w].popleft())
            try:
                result = next(self.results)
            except StopIteration:   # every worker has ended
                self.epoch.finished = True
                raise
            if result is NOTHING:
                continue
            w, batch, snapshot = result
            if batch is _END:
                self.ended[w] = True
            elif not self.ordered:
                return self._hand(w, (batch, snapshot))
            else:
                self.held[w].append((batch, snapshot))

    def _due(self) -> int | None:
        """The worker whose batch is next, if it is here; a worker that has
        ended loses its turn."""
        epoch = self.epoch
        for _ in range(len(self.held)):
            w = epoch.turn
            if not self.held[w] and self.ended[w]:
                epoch.turn = (w + 1) % len(self.held)
                continue
            if self.held[w]:
                epoch.turn = (w + 1) % len(self.held)
                return w
            return None
        return None

    @property
    def failed_batches(self) -> int:
        """As the Loader's epoch iterator (prefetch/_framework.py): the DataLoader's iterator asks."""
        return self.results.failed_batches  # type: ignore[no-any-return]

    @property
    def running(self) -> bool:
        return self.results.running  # type: ignore[no-any-return]

    def _hand(self, w: int, made: tuple[Any, Any]) -> Any:
        batch, snapshot = made
        self.epoch.take(w)
        if isinstance(batch, _Raised):
            raise batch.exc
        self.epoch.delivered(w, snapshot)
        return batch


class _Tasks:
    """The map's iterable: each pass is the current epoch's tasks."""

    def __init__(self, owner: ShardMap) -> None:
        self.owner = owner

    def __iter__(self) -> Any:
        epoch = self.owner.now
        assert epoch is not None
        return epoch.tasks()


class ShardMap:
    """The IterableDataset's loader: one ``prefetch.map`` whose thread w is
    worker w, kept across epochs (iterating it again starts the next one, as
    iterating a Loader again does): with persistent workers, a worker's
    thread, replica and ``worker_init_fn`` state last from epoch to epoch."""

    def __init__(self, loader: Any, options: dict[str, Any], ahead: int, seed: int, order: dict[str, Any],
                 device: Any = None, framework: Any = None) -> None:
        threads = options["workers"]
        self.shards = [_Shard(w, loader, seed) for w in range(threads)]
        self.batch_size = loader.batch_size
        self.framework = framework   # the drop-in's part of the state
        self.order = order           # what decides the order, for the state
        self.resumed: Any = None     # a loaded state's streams: the next epoch starts there
        self.options = options
        self.ordered = options["ordered"]
        self.device = device   # the batches' delivery (pinning), on the map's publisher thread
        self.ahead = ahead
        self.per_worker = max(ahead // threads, 1)   # torch's prefetch_factor
        self.seed = seed     # torch's base seed: prefetch.sample_rng()'s, as in a map-style dataset
        self.epoch = 0       # the next epoch's number (sample_rng() draws anew each epoch)
        self.map: Any = None
        self.now: _ShardEpoch | None = None

    def __iter__(self) -> _InTurn:
        self.cancel()   # the epoch before: its waiting tasks return
        streams, self.resumed = self.resumed, None
        if streams is not None:
            parts, turn = [dict(p) for p in streams["workers"]], streams["next"]
            for shard, part in zip(self.shards, parts):
                shard.resume = part
        else:
            parts, turn = self._starts(), 0
        self.now = _ShardEpoch(self.shards, self.per_worker, self.epoch, self._closing, parts, turn)
        if self.map is None:
            o = self.options   # unordered: _InTurn puts the batches in torch's order
            self.map = FrameworkMap(_Tasks(self), per_thread=self._load_for, lookahead=self.ahead,
                                    workers=o["workers"], depth=o["depth"], timeout=o["timeout"], name=o["name"],
                                    device=self.device)
        self.map.adopt_seed(self.seed, self.epoch)
        self.epoch += 1
        return _InTurn(self.now, iter(self.map), self.ordered)

    def _starts(self) -> list[dict[str, Any]]:
        """Each worker's part as an epoch begins: its replica's own state as
        its last batch left it (persistent replicas carry it over)."""
        return [dict(fresh_part(), dataset=shard.dataset_state) for shard in self.shards]

    def state_dict(self) -> dict[str, Any]:
        """The resume state (prefetch/_resume.py's format): each worker's
        part as of its last batch delivered, the worker due next."""
        now = self.now
        if self.resumed is not None:
            epoch, streams = self.epoch, self.resumed
        elif now is None or now.finished:
            epoch, streams = self.epoch, {"next": 0, "workers": self._starts()}
        else:
            epoch, streams = now.number, {"next": now.turn, "workers": list(now.parts)}
        delivered = sum(p["batches"] for p in streams["workers"])
        return make_state(seed=self.seed, epoch=epoch, prefix=delivered, extras=[], dataset_length=None,
                          batch_size=self.batch_size, order=self.order, sampler=None,
                          streams=copy.deepcopy(streams),
                          framework=self.framework)

    def load_checked(self, resume: Any, seed: int) -> None:
        """The next epoch continues where a state checked by the DataLoader's
        ``load_state_dict`` was taken."""
        self.epoch, self.resumed = resume.epoch, resume.streams

    @property
    def closed(self) -> bool:
        return self._closing()

    def _closing(self) -> bool:
        return self.map is not None and bool(self.map.closed)

    def _load_for(self, worker_id: int) -> Any:
        """The map stage's per_thread: loader thread ``worker_id`` is that worker."""
        return functools.partial(_run_as, self.shards[worker_id])

    def cancel(self) -> None:
        """Tasks waiting for room return."""
        if self.now is not None:
            self.now.cancel()

    def stats(self) -> Stats:
        return Stats() if self.map is None else self.map.stats()

    def close(self) -> None:
        self.cancel()
        if self.map is not None:
            self.map.close()

