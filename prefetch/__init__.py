"""prefetch: a prefetching iterator that hands out fresh, non-aliased batches.

``Prefetcher`` works on numpy batches with no framework installed; framework
adapters (subpackages, declared as entry points) are imported on demand, and
``register_leaf``/``register_container``/``register_device`` let a user add
types of their own (see ``prefetch.adapters``).
"""
from prefetch._types import ClosedError, Stats
from prefetch._version import __version__
from prefetch.adapters import register_container, register_device, register_leaf
from prefetch.iterator import Prefetcher

__all__ = ["ClosedError", "Prefetcher", "Stats", "__version__",
           "register_container", "register_device", "register_leaf"]
