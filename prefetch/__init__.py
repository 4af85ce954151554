"""prefetch: data loading on threads that hands out fresh, non-aliased batches.

``Loader`` calls ``dataset[i]`` on threads and collates the samples straight
into pooled batches; ``map`` runs a function over an iterable on threads;
``Prefetcher`` produces the batches of any iterable ahead of the consumer.
All work on numpy batches with no framework installed; framework adapters are
imported on demand, and ``register_leaf``/``register_container``/
``register_device`` add types of a user's own (see ``prefetch.adapters``).
"""
# ruff: noqa: E402 - the check below runs before the imports that need the compiled core
import importlib.machinery as _machinery
import os as _os


def _check_core_is_built() -> None:
    """The compiled core sits beside this file in an installed package and after an in-place
    build. Without it, ``import prefetch`` run inside a checkout has found the source folder
    (the current folder comes first on sys.path) instead of the installed package, and the
    first ``from prefetch import _core`` would fail as an obscure circular import."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    if any(_os.path.exists(_os.path.join(here, "_core" + s)) for s in _machinery.EXTENSION_SUFFIXES):
        return
    raise ImportError(
        f"you are importing prefetch from its source folder ({here}), where its compiled core "
        "(prefetch/_core) is not built: Python looks in the current folder first, so it hides an installed "
        "prefetch. Run from another folder, or build in place with "
        "`pip install -e .` (or `python setup.py build_ext --inplace`).", name="prefetch._core")


_check_core_is_built()

from prefetch._types import ClosedError, GILBoundWarning, Stats, WorkerInfo
from prefetch._version import __version__
from prefetch.adapters import register_collate, register_container, register_device, register_leaf
from prefetch.iterator import Prefetcher
from prefetch.loader import Loader, map, sample_rng, worker_info

__all__ = ["ClosedError", "GILBoundWarning", "Loader", "Prefetcher", "Stats", "WorkerInfo", "__version__", "map",
           "register_collate", "register_container", "register_device", "register_leaf", "sample_rng", "worker_info"]
