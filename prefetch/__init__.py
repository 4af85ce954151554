"""prefetch: a prefetching iterator that hands out fresh, non-aliased batches.

``Prefetcher`` works on numpy batches without MXNet; ``prefetch.mx`` (imported
only on demand) adds NDArray batches, ``device=`` and a drop-in
``mx.io.PrefetchingIter``.
"""
from prefetch._types import ClosedError, Stats
from prefetch._version import __version__
from prefetch.iterator import Prefetcher

__all__ = ["ClosedError", "Prefetcher", "Stats", "__version__"]
