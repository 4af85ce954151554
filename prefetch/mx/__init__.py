"""MXNet adapter: NDArray leaves, DataBatch containers, ``device=`` an MXNet
context, and ``PrefetchingIter``, a drop-in for ``mx.io.PrefetchingIter``.

``import prefetch`` never imports this package: the core imports it (entry
point ``prefetch.adapters: mxnet``) the first time a batch holds an MXNet
object or ``device=`` is an MXNet context, and importing it registers the
NDArray, DataBatch and Context types.
"""
from prefetch import ClosedError
from prefetch.mx import _device, _ndarray  # noqa: F401  (register their types)
from prefetch.mx._iter import PrefetchingIter
from prefetch.mx._patch import patch, unpatch

__all__ = ["ClosedError", "PrefetchingIter", "patch", "unpatch"]
