"""PyTorch adapter: ``torch.Tensor`` leaves, ``device=`` a ``torch.device``,
and ``DataLoader``, a drop-in for ``torch.utils.data.DataLoader`` that loads on threads.

``import prefetch`` never imports this package: the core imports it (entry
point ``prefetch.adapters: torch``) the first time a batch holds a torch
object, ``device=`` is a ``torch.device`` or a Prefetcher or Loader is made
while torch is imported, and importing it registers the Tensor and device
types. Import it yourself for ``DataLoader``, ``StatefulDataLoader``
(torchdata's), ``get_worker_info`` and ``patch()`` (docs/pytorch.md).
"""
from prefetch.torch import _collate, _device, _tensor  # noqa: F401  (register their types)
from prefetch.torch._dataloader import DataLoader, StatefulDataLoader, get_worker_info
from prefetch.torch._device import CpuDelivery, CudaDelivery
from prefetch.torch._patch import original, patch, unpatch
from prefetch.torch._tensor import copy_tensor

__all__ = ["CpuDelivery", "CudaDelivery", "DataLoader", "StatefulDataLoader", "copy_tensor", "get_worker_info", "original",
           "patch", "unpatch"]


# The framework module whose objects this adapter handles: the core reads this line
# without importing the package where no installed entry point declares it (a
# source tree or a vendored copy of prefetch).
FRAMEWORK = "torch"
