"""MXNet adapter: NDArray leaves, DataBatch containers, ``device=`` an MXNet
context, ``PrefetchingIter``, a drop-in for ``mx.io.PrefetchingIter``, and
``DataLoader``, a drop-in for ``mx.gluon.data.DataLoader`` on threads.

``import prefetch`` never imports this package: the core imports it (entry
point ``prefetch.adapters: mxnet``) the first time a batch holds an MXNet
object, ``device=`` is an MXNet context or a Prefetcher or Loader is made
while MXNet is imported, and importing it registers the NDArray, DataBatch and Context
types and carries MXNet's per-thread NumPy modes to the threads that load and copy.
"""
from prefetch._framework import ClosedError
from prefetch.mx import _collate, _device, _modes, _ndarray  # noqa: F401  (register their types)
from prefetch.mx._dataloader import DataLoader
from prefetch.mx._iter import PrefetchingIter
from prefetch.mx._patch import patch, unpatch

__all__ = ["ClosedError", "DataLoader", "PrefetchingIter", "patch", "unpatch"]


# The framework module whose objects this adapter handles: the core reads this line
# without importing the package where no installed entry point declares it (a
# source tree or a vendored copy of prefetch).
FRAMEWORK = "mxnet"
