"""The one guarded import of PyTorch for the adapter: an ImportError that says
what to install, instead of whatever a missing or broken torch raises."""
_INSTALL = "pip install 'torch>=2.13' (for the CPU build: --index-url https://download.pytorch.org/whl/cpu)"

try:
    import torch
except ImportError as _exc:  # OSError (a broken CUDA library) is torch's own message
    raise ImportError(f"prefetch.torch needs PyTorch: {_INSTALL}; importing torch failed: {_exc!r}") from _exc

__all__ = ["torch"]
