"""PyTorch adapter: ``torch.Tensor`` leaves and ``device=`` a ``torch.device``.

``import prefetch`` never imports this package: the core imports it (entry
point ``prefetch.adapters: torch``) the first time a batch holds a torch
object or ``device=`` is a ``torch.device``, and importing it registers the
Tensor and device types. Importing it yourself is never needed.
"""
from prefetch.torch import _device, _tensor  # noqa: F401  (register their types)
from prefetch.torch._device import CpuDelivery, CudaDelivery
from prefetch.torch._tensor import copy_tensor

__all__ = ["CpuDelivery", "CudaDelivery", "copy_tensor"]
