"""prefetch: data loading on threads that hands out fresh, non-aliased batches.

``Loader`` calls ``dataset[i]`` on several threads and collates the samples
straight into pooled batches; ``map`` runs a function over an iterable on
threads; ``Prefetcher`` produces the batches of any iterable ahead of the
consumer. All work on numpy batches with no framework installed; framework
adapters (subpackages, declared as entry points) are imported on demand, and
``register_leaf``/``register_container``/``register_device`` let a user add
types of their own (see ``prefetch.adapters``).
"""
from prefetch._types import ClosedError, GILBoundWarning, Stats, WorkerInfo
from prefetch._version import __version__
from prefetch.adapters import register_collate, register_container, register_device, register_leaf
from prefetch.iterator import Prefetcher
from prefetch.loader import Loader, map, sample_rng, worker_info

__all__ = ["ClosedError", "GILBoundWarning", "Loader", "Prefetcher", "Stats", "WorkerInfo", "__version__", "map",
           "register_collate", "register_container", "register_device", "register_leaf", "sample_rng", "worker_info"]
