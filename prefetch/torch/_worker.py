"""A loader thread as torch's worker: its ``WorkerInfo`` and its copy of the dataset.

``get_worker_info()`` gives a loader thread what
``torch.utils.data.get_worker_info()`` gives a worker process, read from
prefetch's own ``worker_info()`` of the thread. For a map-style dataset
``thread_replica`` (the Loader's per_thread), then ``init_thread`` (its
worker_init), run on each loader thread as it starts; an IterableDataset's
copies (``stream_replica``) are made with the epoch's Loader, on the
consumer's thread.
"""
from __future__ import annotations

import functools
import random
import sys
import threading
from typing import Any

import numpy as np
from torch.utils.data._utils.worker import _RNG, WorkerInfo

from prefetch._framework import replica, stream_copy
from prefetch._framework import worker_info as prefetch_worker_info
from prefetch.torch._bindings import module_bindings
from prefetch.torch._torch import torch

# A drop-in's loader thread (num_workers > 0) keeps here what prefetch's own
# worker_info() does not hold: .rng, torch's generators of the thread; .replica,
# a map-style dataset's copy (a stream's is prefetch's worker_info().dataset).
_local = threading.local()
DATASETS = (torch.utils.data.Dataset,)   # what a worker's copy of the dataset copies inside it


_torch_get_worker_info = torch.utils.data._utils.worker.get_worker_info


def get_worker_info() -> WorkerInfo | None:
    """torch's ``WorkerInfo`` (id, num_workers, seed, dataset, rng) of the
    drop-in's loader thread calling it, as ``torch.utils.data.get_worker_info()``
    gives it in a worker process; anywhere else (and with ``num_workers=0``)
    what torch's own returns: None outside torch's worker processes.

    ``rng`` holds the thread's own ``random.Random`` and ``torch.Generator``
    seeded with ``seed``, and a ``numpy.random.Generator`` from ``(id,
    base_seed)``: a thread cannot reseed the process-wide generators as a
    worker process does.

    Importing ``prefetch.torch`` rebinds ``torch.utils.data.get_worker_info``
    (and every module-level name bound to it) to this function, so libraries
    that shard a stream by it see their worker in these threads too
    (docs/dropins.md).
    """
    own = prefetch_worker_info()
    rng = getattr(_local, "rng", None)
    if own is None or rng is None:   # not a drop-in's loader thread, or num_workers=0
        return _torch_get_worker_info()
    # torch's default_collate asks it to stack into shared memory, for the
    # pipe back from a worker process: a thread's batch needs none.
    if sys._getframe(1).f_globals.get("__name__") == _COLLATE:
        return None
    # prefetch's answer in torch's words: the loader's seed is torch's base_seed.
    dataset = own.dataset if own.dataset is not None else _local.replica
    return WorkerInfo(id=own.id, num_workers=own.num_workers, seed=own.seed + own.id, dataset=dataset,
                      rng=rng, worker_method="thread")


_COLLATE = "torch.utils.data._utils.collate"


# Every name a loaded module binds torch's get_worker_info to now holds the one
# above (modules imported later read it from torch's, which hold this one by
# then). Rebinding the names is the one way that works: torch's function returns
# its module's global ``_worker_info``, one value for the whole process,
# read by a plain dictionary lookup that no object can make answer per
# thread (and ``get_worker_info() is None`` cannot be answered by a proxy),
# while its ``__code__`` is torch's own to keep.
for _module, _name, _ in module_bindings(_torch_get_worker_info):
    setattr(_module, _name, get_worker_info)


class _ThreadRNG(_RNG):
    """torch's per-worker generators of one loader thread, each made when
    first read: made up front they cost memory (the process's first numpy
    Generator about 1.2 MiB, torch's first draw about 0.5 MiB) a dataset
    that never draws from them would pay for nothing."""

    def __init__(self, worker_id: int, base_seed: int) -> None:  # not the dataclass's: nothing made yet
        # torch's _RNG is frozen and slotted: this subclass's own __dict__ holds
        # the seeds and, through cached_property, each generator once made.
        self.__dict__.update(_worker_id=worker_id, _base_seed=base_seed)

    @functools.cached_property
    def random_generator(self) -> random.Random:  # type: ignore[override]
        return random.Random(self._base_seed + self._worker_id)

    @functools.cached_property
    def torch_generator(self) -> torch.Generator:  # type: ignore[override]
        return torch.Generator().manual_seed(self._base_seed + self._worker_id)

    @functools.cached_property
    def numpy_generator(self) -> object | None:  # type: ignore[override]
        return np.random.default_rng([self._worker_id, self._base_seed & 0xFFFFFFFFFFFFFFFF])


def thread_replica(dataset: Any, worker_id: int) -> Any:
    """A Loader's per_thread: the thread's copy of a map-style dataset, as a
    worker process holds one (``get_worker_info().dataset`` names it)."""
    _local.replica = replica(dataset, DATASETS)
    return _local.replica


# An IterableDataset's copy for a worker, stream_replica(dataset, worker_id), made
# as the epoch's loader is; its thread finds it as prefetch's worker_info().dataset.
stream_replica = functools.partial(stream_copy, kinds=DATASETS)


def init_thread(worker_init_fn: Any, worker_id: int) -> None:
    """A Loader's worker_init where num_workers > 0 (``worker_init_fn``
    bound): torch's generators for the thread (what makes
    ``get_worker_info()`` answer there), then the user's
    ``worker_init_fn(worker_id)``."""
    own = prefetch_worker_info()
    _local.rng = _ThreadRNG(own.id, own.seed)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
