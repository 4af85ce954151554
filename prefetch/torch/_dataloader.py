"""``prefetch.torch.DataLoader``: torch's constructor validates the
arguments, builds the samplers and gives ``len()`` and the persistent-workers
logic; only the iterator (``_ThreadIter``) is ours, each worker a thread of
a ``prefetch.Loader`` (``_worker.py``).

Threading contract: ``_Batches._take``, the collate for ``batch_size=None``
and what ``_worker.py`` says run on loader threads; everything else on the
consumer's thread.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import os
import warnings
import weakref
from typing import Any, TypeVar

from torch.utils.data import IterableDataset, RandomSampler, default_collate
from torch.utils.data._utils.pin_memory import pin_memory as _pin

from prefetch._framework import (
    MAX_EPOCH,
    Choice,
    ClosedError,
    Closing,
    FrameworkLoader,
    Identity,
    Stats,
    check_dataset,
    check_int,
    check_loading,
    check_num_workers,
    close_when_dropped,
    machinery,
    order_part,
    start_part,
    try_state,
    warn_at_user,
)
from prefetch.torch._collate import as_torch
from prefetch.torch._device import PinnedHost
from prefetch.torch._processes import STREAM_STATE, TorchEpoch, Workers, decide
from prefetch.torch._sampler import (
    _Batches,
    decode_generator,
    draw_seed,
    drawing_from,
    encode_generator,
    loader_generator,
    sampler_part,
    sampler_side,
)
from prefetch.torch._torch import torch
from prefetch.torch._worker import get_worker_info, init_thread, stream_replica, thread_replica

__all__ = ["DataLoader", "StatefulDataLoader", "get_worker_info"]

_T_co = TypeVar("_T_co", covariant=True)
_REPLICAS = ("For multiprocessing data-loading, this could be caused by not properly configuring the "
             "IterableDataset replica at each worker. Please see "
             "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")


_TORCH_INIT = inspect.signature(torch.utils.data.DataLoader.__init__)
# torch's own frames, between a drop-in's warning and the user's line (its
# constructor calls ours through super().__init__, its __iter__ our _get_iterator).
machinery(os.path.dirname(os.path.abspath(torch.utils.data.__file__)) + os.sep)


_A_STREAM = ("for a generator or any other stream, subclass torch.utils.data.IterableDataset (its "
             "__iter__ yields the samples) and pass an instance of it")


def _check_given(given: dict[str, Any], loading: str) -> None:
    """The arguments torch's constructor accepts and its iterator would fail
    on (or print without their quotes), refused here, where they are given
    (``given`` empty: a call torch refuses, which its own ``__init__`` says)."""
    if "dataset" in given and not isinstance(given["dataset"], IterableDataset):
        check_dataset(given["dataset"], _A_STREAM)
    if "num_workers" in given:
        check_num_workers(given["num_workers"])
    if loading == "processes" and given and not given.get("num_workers", 0):
        raise ValueError("loading='processes' loads in torch's worker processes: it needs num_workers >= 1, got "
                         "num_workers=0 (torch then loads in its main process; loading='threads' loads on one "
                         "thread)")
    size = given.get("batch_size", 1)
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        # torch's condition and words, with the value as written ('4', not 4)
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={size!r}")


class DataLoader(torch.utils.data.DataLoader[_T_co], Closing):
    """``torch.utils.data.DataLoader`` (a subclass: the same signature,
    samplers, batches and errors for bad arguments) loading on
    ``num_workers`` threads (0: one thread, with ``get_worker_info()`` None
    and no ``worker_init_fn``, as torch's main-process loading). On threads
    nothing is pickled; ``dataset[i]`` must allow being called by several threads at
    once. Each worker thread loads from a copy of the dataset, as each of
    torch's worker processes does; an ``IterableDataset`` shards itself
    through ``torch.utils.data.get_worker_info()``, which answers in these
    threads.

    ``loading`` (keyword only, not torch's): ``"threads"``, ``"processes"``
    (torch's own iterator and ``num_workers >= 1`` worker processes) or
    ``"auto"`` (the default: threads, handing a map-style epoch's rest to
    torch's processes, where they can run it, once the threads measure that
    ``dataset[i]`` holds the GIL); ValueError for any other value.

    A dataset's exception is raised as itself, with a note naming the sample
    and the thread; after a dataset's or ``collate_fn``'s error, ``next()``
    goes on with the next batch, as torch's does. ``close()`` and ``with``
    are not torch's; the other differences from torch's (copies, seeds,
    pinning, loading ahead, resuming): docs/dropins.md.
    """

    # load_state_dict(): the state the next iterator continues, and what its one check gave (resume, seed)
    _loaded: tuple[dict[str, Any], Any, int] | None = None
    _position: _Position | None = None       # the iterator made last, as state_dict() reads it

    def __init__(self, *args: Any, loading: str = "auto", **kwargs: Any) -> None:
        check_loading(loading)
        self.loading = loading   # before torch's __init__, whose worker-count check reads it
        self._choice = Choice(loading)   # where its epochs load (_processes.py), decided once
        try:
            given = _TORCH_INIT.bind(self, *args, **kwargs).arguments
        except TypeError:
            given = {}   # a call torch refuses: torch's own __init__ says why, below
        _check_given(given, loading)
        super().__init__(*args, **kwargs)
        self._gil_noticed = [False]   # the iterators' GIL notice was given (see _ThreadIter)

    # torch's, and loading=, for help() and IDEs.
    __init__.__signature__ = _TORCH_INIT.replace(  # type: ignore[attr-defined]
        parameters=[*_TORCH_INIT.parameters.values(),
                    inspect.Parameter("loading", inspect.Parameter.KEYWORD_ONLY, default="auto")])

    _closed = False   # close() ran: no epoch starts again

    def _get_iterator(self) -> Any:
        if self._closed:
            raise ClosedError("this DataLoader is closed")
        self.check_worker_number_rationality()   # as torch, for each new iterator
        it = _ThreadIter(self)
        self._position = it.position
        return it

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration is, as torchdata's ``StatefulDataLoader`` gives
        it: a small JSON-serialisable dict, exact at any moment (mid-epoch,
        with ``in_order=False`` too, after a ``break``, after ``close()``).
        Give it to ``load_state_dict`` of a new DataLoader over the same data
        to continue with the batches an uninterrupted run would have handed
        out next. What it holds (a stream's parts under torchdata's names) and
        what it does not restore: docs/dropins.md."""
        return _torchdata_names(self._core_state(), self.num_workers)

    def _core_state(self) -> dict[str, Any]:
        """The state in the core's names."""
        if self._loaded is not None:
            return copy.deepcopy(self._loaded[0])
        position = self._position
        if position is not None and not position.spent:
            return position.source.state_dict()  # type: ignore[no-any-return]
        # A new iterator's state: its seed and epoch drawn from where the
        # generator is (read through a copy: nothing is drawn).
        draw = loader_generator(self).clone_state()
        seed = draw_seed(draw)
        sampler = streams = None
        if isinstance(self.dataset, IterableDataset):
            # New workers copy the dataset as it is now: its own state with it
            # (a pass counter kept across epochs; with 0 workers, the one object).
            part = start_part(self.dataset)
            streams = {"next": 0, "workers": [copy.deepcopy(part) for _ in range(max(self.num_workers, 1))]}
        else:
            # The epoch draws from the DataLoader's generator after the iterator's seed.
            generators, samplers = sampler_side(self)
            sampler = sampler_part([draw, *generators[1:]], samplers)
        return self._identity().state(seed=seed, epoch=0, sampler=sampler, streams=streams)

    def _identity(self, framework: dict[str, Any] | None = None) -> Identity:
        """What this DataLoader's states are of, with the torch part ``framework``
        (None: the one of an iterator made now). ``shuffle=True`` is torch's
        ``RandomSampler``."""
        stream = isinstance(self.dataset, IterableDataset)
        return Identity(self.dataset, stream=stream, batch_size=self.batch_size,
                        order=order_part(isinstance(self.sampler, RandomSampler), self.sampler, self.batch_sampler),
                        sampler_state=not stream, framework=framework or _torch_part(loader_generator(self)),
                        workers=max(self.num_workers, 1) if stream else None, owner="DataLoader")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next ``iter(loader)`` continues where ``state`` (from
        ``state_dict()``) was taken; an iterator made before (persistent
        workers' included) goes on with its own epoch, as torchdata's
        ``StatefulDataLoader``'s does.

        Raises
        ------
        ValueError, TypeError
            For a state that does not fit this DataLoader (dataset length or
            kind, batch size, order: the sampler's kind, shuffled or not;
            workers reading a stream, a generator or sampler state refused, an
            edited or truncated one): the DataLoader is then unchanged.
        prefetch.ClosedError
            Once the DataLoader is closed.
        """
        if self._closed:
            raise ClosedError("this DataLoader is closed: cannot load a state into it")
        _refuse_torchdatas(state)
        if isinstance(state, dict) and "_iterator_finished" in state:
            # torchdata's key, which Accelerate sets on any loader's state
            # (whether its epoch ended): the state itself says that here.
            state = {k: v for k, v in state.items() if k != "_iterator_finished"}
        state = _core_names(state)
        iterable = isinstance(self.dataset, IterableDataset)
        if iterable and self.loading == "processes" and isinstance(state, dict) and state.get("batches"):
            raise ValueError(f"state has batches={state['batches']!r}: {STREAM_STATE}")
        resume, seed = self._identity().check(state, None, -1 if iterable else len(self))
        try:
            if draw_seed(decode_generator(resume.framework["iterator_rng"])) != seed:
                raise ValueError("its seed is not the one its iterator_rng draws")
            if not iterable:
                _check_sampler_part(resume.sampler, self)
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"state has a bad torch part (truncated or edited?): {exc}") from None
        self._iterator = None   # persistent workers: the next iter() makes one from the state
        self._loaded = copy.deepcopy(state), resume, seed

    def check_worker_number_rationality(self) -> None:
        """torch's ``UserWarning`` when ``num_workers`` exceeds the CPUs this
        process may use (``torch._utils.cpu_count()``), in torch's words but
        "worker threads" (with ``loading="processes"``: "worker processes"),
        at the user's line, past torch's ``__init__`` and ``__iter__``."""
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
        workers = "processes" if self.loading == "processes" else "threads"
        warn_at_user(f"This DataLoader will create {self.num_workers} worker {workers} in total. {suggested} "
                     "Please be aware that excessive worker creation might get DataLoader running slow or "
                     "even freeze, lower the worker number to avoid potential slowness/freeze if necessary.",
                     UserWarning)

    def stats(self) -> Stats:
        """The ``prefetch.Stats`` of the epoch begun last (``loading``: "threads"
        or torch's worker "processes"), also once it ended, was left with a
        ``break`` or closed; all zero before the first epoch."""
        position = self._position
        if position is None:
            return Stats()
        stats = position.source.stats()   # a closed source keeps its figures
        return stats if stats.loading else dataclasses.replace(stats, loading="threads")

    def close(self) -> None:
        """Stops its threads at once, persistent or not (idempotent): an
        iteration in progress raises ``prefetch.ClosedError`` at its next
        ``next()``, as does a new one."""
        self._closed = True
        if self._position is not None:   # the iterator made last (persistent workers' too) and its epoch
            self._position.close()

    def __getstate__(self) -> dict[str, Any]:
        """What pickles is what torch's loader pickles (the dataset, the
        samplers, the arguments) and a loaded state: not the threads of an
        epoch begun, which stay in this process as torch's worker processes do."""
        return dict(self.__dict__, _position=None, _iterator=None)


class StatefulDataLoader(DataLoader[_T_co]):
    """torchdata's ``StatefulDataLoader`` (``torchdata.stateful_dataloader``)
    on threads: ``prefetch.torch.DataLoader`` with its one more argument,
    ``snapshot_every_n_steps`` (int >= 0 or None), accepted and checked. It
    changes nothing: here each worker's state travels with each batch, so the
    state is exact at every step. Its states are ``prefetch.torch.DataLoader``'s
    (one format); a checkpoint torchdata's own class saved is refused naming
    it (docs/dropins.md: which checkpoints load)."""

    def __init__(self, *args: Any, snapshot_every_n_steps: int | None = 1, **kwargs: Any) -> None:
        if snapshot_every_n_steps is not None:
            check_int("snapshot_every_n_steps", snapshot_every_n_steps, 0, MAX_EPOCH)
        self.snapshot_every_n_steps = snapshot_every_n_steps
        super().__init__(*args, **kwargs)


def _torch_part(generator: Any) -> dict[str, Any]:
    """The state's torch part: its name, and the generator's state as the iterator draws its seed."""
    return {"name": "torch.utils.data.DataLoader", "iterator_rng": encode_generator(generator)}


# Keys of a state torchdata's own StatefulDataLoader saved (with 0 workers; with workers).
_TORCHDATAS = frozenset(("_num_yielded", "_sampler_iter_state", "_index_sampler_state", "_steps_since_snapshot"))
# A stream worker's part of a state under torchdata's names (its worker snapshot's, and the
# worker's count of batches delivered, which torchdata's has no name for).
_SNAPSHOT_KEYS = ["batches", "dataset_state", "fetcher_state"]


def _torchdata_names(state: dict[str, Any], num_workers: int) -> dict[str, Any]:
    """``state`` (the core's) with a stream's parts named as torchdata's
    ``StatefulDataLoader`` names them, instead of the core's ``streams``:
    worker w's in ``_snapshot["_worker_snapshots"]["worker_<w>"]``, beside
    the worker due ``next`` (with ``num_workers=0`` the one worker's at the
    top level, its batches the state's own ``batches``); in each, the
    dataset's own state as ``dataset_state`` (None where the dataset is its
    own iterator: the state is its iterator's) and the iterator's as
    ``fetcher_state["dataset_iter_state"]``."""
    streams = state.pop("streams")
    if streams is None:   # a map-style dataset's state
        return state
    snapshots = [{"batches": part["batches"], "dataset_state": part["dataset"],
                  "fetcher_state": {"dataset_iter_state": part["iterator"]}} for part in streams["workers"]]
    if num_workers:
        state["_snapshot"] = {"next": streams["next"],
                              "_worker_snapshots": {f"worker_{w}": s for w, s in enumerate(snapshots)}}
    else:
        state.update(dataset_state=snapshots[0]["dataset_state"], fetcher_state=snapshots[0]["fetcher_state"])
    return state


def _core_names(state: Any) -> Any:
    """``_torchdata_names`` undone: the core's ``streams`` part of a drop-in's
    ``state``, for the one check (a map-style state's is None). ValueError
    where those names hold no worker's part (edited or truncated)."""
    if not isinstance(state, dict) or "format" not in state or "streams" in state:
        return state   # not a drop-in's state (a Loader's has the core's names): the check says what it is
    state = dict(state)
    try:
        if "_snapshot" in state:
            snapshot = state.pop("_snapshot")
            if sorted(snapshot) != ["_worker_snapshots", "next"]:
                raise ValueError(f"_snapshot has the keys {sorted(snapshot)}, not _worker_snapshots and next")
            due, snapshots = snapshot["next"], snapshot["_worker_snapshots"]
            workers = [snapshots[f"worker_{w}"] for w in range(len(snapshots))]
        elif "fetcher_state" in state or "dataset_state" in state:
            due, workers = 0, [{"batches": state.get("batches"), "dataset_state": state.pop("dataset_state"),
                                "fetcher_state": state.pop("fetcher_state")}]
        else:
            return dict(state, streams=None)
        for s in workers:
            if sorted(s) != _SNAPSHOT_KEYS or list(s["fetcher_state"]) != ["dataset_iter_state"]:
                raise ValueError(f"a worker's snapshot must have the keys {_SNAPSHOT_KEYS}, its fetcher_state "
                                 f"the key 'dataset_iter_state', got {s!r:.100}")
        state["streams"] = {"next": due, "workers": [{"batches": s["batches"], "dataset": s["dataset_state"],
                                                      "iterator": s["fetcher_state"]["dataset_iter_state"]}
                                                     for s in workers]}
    except KeyError as exc:
        raise ValueError(f"state's stream parts lack {exc} (truncated or edited?)") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"state has bad stream parts (truncated or edited?): {exc}") from None
    return state


def _refuse_torchdatas(state: Any) -> None:
    """ValueError for a checkpoint torchdata's StatefulDataLoader saved, named
    as what it is rather than as a state with a bad format."""
    if isinstance(state, dict) and not _TORCHDATAS.isdisjoint(state):
        keys = sorted(_TORCHDATAS.intersection(state))
        raise ValueError(f"state is a checkpoint of torchdata's own StatefulDataLoader (keys {keys}), which "
                         "prefetch.torch's loaders cannot load: they load a state_dict() of "
                         "prefetch.torch.DataLoader or prefetch.torch.StatefulDataLoader only. Resume from "
                         "the start of that checkpoint's epoch with a new loader, and save the later "
                         "checkpoints from prefetch.torch's")


def _check_sampler_part(part: Any, loader: Any) -> None:
    """ValueError unless ``part`` (a state's sampler side) fits ``loader``:
    one generator state per generator, each one torch accepts; one state per
    stateful sampler, each one that sampler accepts (tried on it, its own
    put back: the resumed epoch loads it as it begins)."""
    generators, samplers = part["generators"], part["samplers"]
    expected, stateful = sampler_side(loader)
    if not isinstance(generators, list) or len(generators) != len(expected):
        raise ValueError(f"it has {len(generators)!r} generator states; this DataLoader draws from {len(expected)}")
    for text in generators:
        decode_generator(text)
    if not isinstance(samplers, list) or len(samplers) != len(stateful):
        raise ValueError(f"it has states for {len(samplers)!r} sampler(s) with a state of their own; "
                         f"this DataLoader has {len(stateful)}")
    for s, saved in zip(stateful, samplers):
        try_state(s, saved)


class _ThreadIter:
    """One epoch (or, with persistent workers, every epoch) of a DataLoader."""

    def __init__(self, loader: DataLoader) -> None:
        if loader.pin_memory and loader.pin_memory_device:
            warn_at_user("pin_memory_device is deprecated, the current accelerator will be used as the "
                         f"device,ignore pin_memory_device='{loader.pin_memory_device}'.", UserWarning)
        self._pin = loader.pin_memory and torch.accelerator.is_available()
        if loader.pin_memory and not self._pin:
            warn_at_user("'pin_memory' argument is set as true but no accelerator is found, then device "
                         "pinned memory won't be used.", UserWarning)
        accelerator = torch.accelerator.current_accelerator() if self._pin else None
        self._pin_device = accelerator.type if accelerator is not None else None
        self._timeout = loader.timeout
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
        # generator to where it was (torch's global one: see drawing_from).
        generator = loader_generator(loader)
        loaded, loader._loaded = loader._loaded, None
        saved = None if loaded is None else loaded[0]["framework"]["iterator_rng"]
        with contextlib.nullcontext() if saved is None else drawing_from(generator, saved):
            framework = _torch_part(generator)
            base_seed = draw_seed(loader.generator)
        self._batches: _Batches | None = None
        self._choice: Choice = loader._choice
        self._loader = weakref.ref(loader)   # read at a hand-over to torch's processes; not kept alive
        # torch's worker processes, once they load: they draw the base seed where this iterator drew it.
        self._workers = Workers(framework["iterator_rng"])
        # The epoch begun, once they load it; once it is also self._epoch, the
        # threads have handed out their part of it and torch's workers go on.
        self._processes: TorchEpoch | None = None
        self._handed = 0   # batches of the epoch handed out (or failed), those before a resume too
        auto = loader._auto_collation
        # torch's default_collate: the Loader's own gives the same batches, each sample
        # copied once (torch copies twice); as_torch turns its numpy leaves into tensors.
        self._convert = auto and loader.collate_fn is default_collate
        collate = None if self._convert else loader.collate_fn
        # One GIL notice per DataLoader, though each epoch without persistent workers
        # has a Loader of its own.
        self._gil_noticed = loader._gil_noticed
        # Each worker thread loads from a copy of its own, as each worker process;
        # with num_workers=0 from the dataset itself, as torch's main process.
        if self._iterable:
            per_thread: Any = stream_replica if loader.num_workers > 0 else lambda dataset, worker_id: dataset
            # torch's batch_size=None hands out collate_fn(sample) for each sample.
            batching: dict[str, Any] = dict(batch_size=loader.batch_size, drop_last=loader.drop_last, collate=collate)
        else:
            self._batches = _Batches(loader, ahead=self._ahead)
            per_thread = thread_replica if loader.num_workers > 0 else None
            # batch_size=None: torch applies collate_fn to each sample itself.
            batching = dict(batch_sampler=self._batches,
                            collate=collate if auto else lambda samples: collate(samples[0]))
        # None with num_workers=0: torch loads in its main process then, with no worker_init_fn.
        init = functools.partial(init_thread, loader.worker_init_fn) if loader.num_workers else None
        # torch's base_seed seeds prefetch.sample_rng(): the same torch seed, the same draws.
        # A batch's error is that batch's; the epoch goes on (torch's does).
        # Pinned on the publisher thread, as on torch's pin-memory thread;
        # what only torch's pin_memory() knows (an object's own) on the consumer's.
        self._source = FrameworkLoader(loader.dataset, per_thread=per_thread, worker_init=init, seed=base_seed,
                                       lookahead=self._ahead, go_on=True, gil_noticed=self._gil_noticed[0],
                                       device=PinnedHost() if self._pin else None,
                                       identity=loader._identity(framework),
                                       remedy="torch.utils.data.DataLoader(dataset, num_workers=N)",
                                       # workers to hand the batches to (one thread: no notice)
                                       on_notice=self._choice.on_notice(loader.num_workers > 0),
                                       **batching, **options)
        if loaded is not None:
            state, resume, seed = loaded
            self._source.load_checked(resume, seed)   # checked once, by load_state_dict
            self._handed = state["batches"]
            if self._batches is not None:
                self._batches.dropped = state["batches"]   # read again as the epoch begins, then dropped
        self.position = _Position(self, self._source)
        # torch's iterators have no close(): one dropped mid-epoch closes its loader,
        # not making the dropping line wait for a thread inside dataset[i].
        close_when_dropped(self, self._source.close)
        close_when_dropped(self, self._workers.close)
        self._done = False
        self._yielded = self._taken = 0   # batches of the epoch handed out; and failed too
        self._epoch: Any = None
        self._reset(loader)

    def _reset(self, loader: DataLoader) -> None:
        """An epoch begins (torch calls it again for each epoch of persistent
        workers: same threads, same replicas)."""
        self._len_called = loader._IterableDataset_len_called
        if self._closed:
            raise ClosedError("this DataLoader is closed")
        if self._epoch is not None and not self._taken and not self._done:
            return   # nothing taken from the epoch begun: it is this one
        if self._epoch is not None:
            self._handed = 0
        self._yielded = self._taken = 0
        self._done = False
        self.position.spent = False
        self.position.source = self._source
        self._processes = None
        if self._choice.processes and self._iterable:
            self._hand_over()   # torch's workers read the stream from its start
            self._epoch = self._processes
            # The threads' Loader counts the epoch begun, as where it loads one itself.
            self._source.set_epoch(self._epoch.state["epoch"] + 1)
            return
        self._epoch = iter(self._source)   # a map-style epoch reads its sampler here (_Batches)
        if self._choice.processes:
            self._hand_over()

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
        if self._epoch is self._processes:
            return self._from_processes()
        if self._batches is not None:
            # torch reads one batch more for each it hands out: the one due now too.
            self._batches.read_to(self._ahead + self._handed + 1)
        epoch = self._epoch
        failed = epoch.failed_batches
        try:
            batch = next(self._epoch)
        except TimeoutError as exc:   # the epoch goes on: next() waits again
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from exc
        except StopIteration:
            if self._closed:   # by another thread while this one waited
                raise ClosedError("this DataLoader was closed during its epoch") from None
            if self._processes is not None:   # the threads' part is over: torch's workers go on
                self._epoch = self._processes
                return self._from_processes()
            self.position.spent = not self._persistent
            self._end(close=not self._persistent)
            raise
        except BaseException as exc:
            if epoch.failed_batches != failed:
                # That batch's own error (the dataset's, collate_fn's):
                # the epoch goes on with the next batch, as torch's does.
                self._handed_one()
            elif not (isinstance(exc, KeyboardInterrupt) and epoch.running):
                # Not Ctrl-C while next() waited (nothing taken: the next
                # next() waits for the same batch, as torch's does): the end.
                self._end(close=False)
            raise
        self._handed_one()
        self._yielded += 1
        # The threads measured dataset[i] holding the GIL: torch's workers load the rest where they can.
        if self._processes is None and self._choice.notices and decide(self._choice, self._loader(), self._iterable):
            self._hand_over()   # where every batch was opened, the next epoch begins in processes
        if self._iterable and self._len_called is not None and self._yielded > self._len_called:
            warnings.warn(f"Length of IterableDataset {self._dataset} was reported to be {self._len_called}"
                          f"(when accessing len(dataloader)), but {self._yielded} samples have been "
                          "fetched. " + _REPLICAS * (self._num_workers > 0), stacklevel=2)
        if self._convert:
            batch = as_torch(batch)
        if self._pin:
            batch = _pin(batch, self._pin_device)
        return batch

    def _handed_one(self) -> None:
        """A batch of the epoch handed out (or its error raised in its place)."""
        self._handed += 1
        self._taken += 1
        if self._processes is not None:
            self._processes.handed = self._handed

    def _hand_over(self) -> None:
        """The batches of the epoch begun that no thread opened go to torch's
        worker processes (started here, or persistent ones reset), which load
        them while the threads finish theirs (and the next epoch's batches
        they opened early, which it hands out first)."""
        rest = None if self._batches is None else self._batches.rest()
        loader = self._loader()
        if (rest is None and not self._iterable) or loader is None:
            return
        self._workers.begin(loader, rest)
        self._processes = TorchEpoch(self._source, self._workers, self._handed, self._iterable)
        self.position.source = self._processes

    def _from_processes(self) -> Any:
        processes = self._processes
        assert processes is not None
        try:
            batch = processes.take()
        except StopIteration:
            self.position.spent = not self._persistent
            self._end(close=not self._persistent)
            raise
        finally:
            self._handed = processes.handed
        self._taken = self._handed
        return batch

    def _end(self, close: bool) -> None:
        """The epoch is over; its threads go if ``close``."""
        self._done = True
        self._gil_noticed[0] = self._gil_noticed[0] or self._source.gil_noticed
        if close:
            self._source.close()
            self._workers.close()

    def close(self) -> None:
        """Its threads stop; its next() raises ClosedError."""
        self._closed = True
        self._end(close=True)


class _Position:
    """What ``state_dict()`` reads of the DataLoader iterator made last:
    its source (the thread Loader, or the ``TorchEpoch`` torch's workers
    finish), kept after the iterator is gone (a break) and after it closed:
    the state of a run that saves its checkpoint after leaving its loop, or
    on shutdown."""

    __slots__ = ("source", "spent", "iterator")

    def __init__(self, iterator: _ThreadIter, source: Any) -> None:
        self.source = source
        self.spent = False   # its epoch ended, and the next iter() makes a new iterator (not persistent)
        self.iterator = weakref.ref(iterator)   # not kept alive: dropped, it closes its source

    def close(self) -> None:
        """The DataLoader closed: its iterator's next() raises ClosedError."""
        iterator = self.iterator()
        if iterator is not None:
            iterator.close()
        self.source.close()

