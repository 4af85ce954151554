"""An iterable dataset (a stream) on a Loader's threads, thread w being
worker w: it alone holds worker w's replica, calls ``iter()`` on it each
epoch and fills the map stage's slots of that worker's batches (_map.pxi;
docs/design.md). Each batch carries its worker's part of the resume state
after it, the worker's part once delivered (``StreamRecord`` in
prefetch/_resume.py) and where a resumed worker starts (``_Worker.start``).

Threading contract: a ``_Worker`` is used by its thread only; ``Workers.resumed``
and ``Workers.turn`` are set by the consumer's thread between epochs
(``begin``); ``StreamRecord`` is read on any thread.
"""
from __future__ import annotations

import collections
import copy
import itertools
from typing import Any, Callable, Optional

from prefetch._replica import replica
from prefetch._resume import stateful


def start_part(dataset: Any) -> dict[str, Any]:
    """A worker's part of the state as its stream starts from ``dataset``
    (its replica, or what it copies): the dataset's own state then, where it
    has one (a stream that is its own iterator resumes there)."""
    state = None
    if stateful(dataset):
        try:
            state = copy.deepcopy(dataset.state_dict())
        except Exception:
            if not hasattr(dataset, "__next__"):
                raise
            # Its own iterator, whose state its __iter__ makes: none yet.
    return {"batches": 0, "dataset": state, "iterator": None}


def stream_copy(dataset: Any, worker_id: int = 0, kinds: tuple[type, ...] = ()) -> Any:
    """Worker ``worker_id``'s copy of a stream: a deep one where it can be
    made (a stream's objects hold its position, a library's shard iterators,
    which each worker process has its own of), else a shallow one with each
    instance of ``kinds`` in it copied too (prefetch/_replica.py)."""
    try:
        return copy.deepcopy(dataset)
    except Exception:
        return replica(dataset, (type(dataset), *kinds))


class _Worker:
    """One worker of a stream: its replica, its iterator of the epoch, and
    the batch it read last until its rows are loaded."""

    def __init__(self, worker_id: int, dataset: Any, owner: Workers) -> None:
        self.id = worker_id
        self.dataset = dataset
        self.owner = owner
        self.epoch = -1
        self.iterator: Any = None
        self.batches = 0           # batches read this epoch (those resumed past included)
        self.first = 0             # the number in the epoch of the first sample of the batch read last
        self.samples: list[Any] = []
        self.state: Any = None     # (dataset's, iterator's) states after the batch read last
        self.own_state = False     # the dataset has a state of its own (not its iterator's)

    def read(self) -> tuple[list[int], bool]:
        """The next batch's rows: its samples' numbers in the epoch (none once
        the stream has ended), and whether it has ended."""
        rows = self.owner.rows
        samples = []
        ended = False
        # next() itself, not islice(): that calls iter(), which restarts a
        # stream that is its own iterator.
        for _ in range(rows):
            try:
                samples.append(next(self.iterator))
            except StopIteration:
                ended = True
                break
        if len(samples) < rows and self.owner.drop_last:
            samples = []
        self.first += len(self.samples)
        self.samples = samples
        if samples:
            self.batches += 1
            # The dataset's and the iterator's own states now (copies: the
            # next batch changes them); the dataset's only where it is not
            # its own iterator.
            self.state = (copy.deepcopy(self.dataset.state_dict()) if self.own_state else None,
                          copy.deepcopy(self.iterator.state_dict()) if stateful(self.iterator) else None)
        return list(range(self.first, self.first + len(samples))), ended

    def sample(self, key: int) -> Any:
        """The sample numbered ``key`` of the batch read last (the thread's load)."""
        i = key - self.first
        sample, self.samples[i] = self.samples[i], None   # held by its batch's row alone
        return sample

    def start(self, epoch: int) -> None:
        """Epoch ``epoch``'s iterator, made as its first batch is read; from a
        loaded state's part, as a stateful framework loader restores a worker: the dataset's
        own state first, then ``iter()``, then the iterator's own state;
        where neither has one, the batches delivered before are read again
        and dropped."""
        if epoch == self.epoch:
            return
        self.epoch, self.batches, self.first, self.samples = epoch, 0, 0, []
        resumed = self.owner.resumed   # (epoch, parts) of a loaded state
        part = resumed[1][self.id] if resumed is not None and resumed[0] == epoch else None
        if part is not None and part["dataset"] is not None and stateful(self.dataset):
            self.dataset.load_state_dict(copy.deepcopy(part["dataset"]))
        self.iterator = iter(self.dataset)
        self.own_state = self.iterator is not self.dataset and stateful(self.dataset)
        if part is None:
            return
        self.batches = part["batches"]
        self.state = (part["dataset"], part["iterator"])
        if part["iterator"] is not None and stateful(self.iterator):
            self.iterator.load_state_dict(copy.deepcopy(part["iterator"]))
        elif not (self.own_state or stateful(self.iterator)):
            collections.deque(itertools.islice(self.iterator, part["batches"] * self.owner.rows), maxlen=0)


class Workers:
    """A stream Loader's map-stage hook: ``self(worker_id)``, on each loader
    thread as it starts, gives that thread its worker. Holds no reference to
    the Loader, which the threads must not keep alive."""

    def __init__(self, dataset: Any, count: int, rows: int, drop_last: bool,
                 replicate: Callable[[Any, int], Any]) -> None:
        self.count = count
        self.rows = rows
        self.drop_last = drop_last
        self.resumed: Optional[tuple[int, list[dict[str, Any]]]] = None   # (epoch, parts) of a loaded state
        self.turn = 0   # the worker due first in the epoch begun last
        # Each worker's copy, made here, on the thread that makes the loader:
        # a deep copy of a library's dataset can fail on another thread (a
        # Hugging Face stream: "dictionary changed size during iteration"),
        # and the shallow one made instead would share its shard iterators
        # and their state between the workers.
        self.copies = [replicate(dataset, w) for w in range(count)]

    def __call__(self, worker_id: int) -> _Worker:
        return _Worker(worker_id, self.copies[worker_id], self)

    def begin(self, epoch: int, resumed: Optional[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """Epoch ``epoch`` begins, continuing a loaded state's stream parts
        ``resumed`` (None: from each worker's start): each worker's part then
        and the worker due first."""
        if resumed is None:
            self.resumed, self.turn = None, 0
            return self.starts(), 0
        parts = [dict(p) for p in resumed["workers"]]
        self.resumed, self.turn = (epoch, parts), resumed["next"]
        return list(parts), self.turn

    def starts(self) -> list[dict[str, Any]]:
        """Each worker's part as an epoch begins (its threads not reading):
        its copy's own state."""
        return [start_part(dataset) for dataset in self.copies]
