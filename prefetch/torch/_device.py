"""``device=`` a ``torch.device``: validated once, in the
prefetcher's or loader's constructor; every array leaf of a batch delivered there as a
tensor; device memory returned at close.

numpy leaves whose dtype torch can hold become tensors too (``device=`` asks
for torch tensors); the others (object, string, structured, big-endian) stay
numpy arrays.

CUDA (``CudaDelivery``): pool blocks themselves are not pinned
(``cudaHostRegister``): the core frees pool blocks on its own (trimming, close)
without telling the adapter, and freeing registered memory without
``cudaHostUnregister`` is undefined; torch's caching host allocator stages
them instead (reused: steady state pins nothing new). Each device tensor is
marked used on the stream current when the prefetcher (or loader) was built
(the consumer's), so the caching allocator does not reuse its memory before the
consumer's work on it is done; a consumer that computes on another stream
must call ``t.record_stream(its_stream)`` itself.

Threading contract: ``deliver`` and ``ready`` run on the publisher thread with the
GIL held, after the batch's host copies are complete; ``close`` in close().
This path has not been run on a GPU here (tests/pytorch/gpu_check.py checks it).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from prefetch._framework import register_device
from prefetch.torch._tensor import NUMPY_DTYPES
from prefetch.torch._torch import torch

_FROM_NUMPY = frozenset(torch.empty(0, dtype=dt).numpy().dtype for dt in NUMPY_DTYPES)


def as_tensor(leaf: Any) -> Any:
    """A numpy leaf as a tensor over the same (fresh, pool-backed) memory, when
    torch can hold its dtype; any other leaf unchanged."""
    if type(leaf) is np.ndarray and leaf.dtype in _FROM_NUMPY:
        return torch.from_numpy(leaf)
    return leaf


class CpuDelivery:
    """``device=torch.device('cpu')``: leaves stay in host memory, as tensors."""

    def deliver(self, leaf: Any) -> Any:
        leaf = as_tensor(leaf)
        if isinstance(leaf, torch.Tensor) and not leaf.is_cpu:
            leaf = leaf.to("cpu")   # a CUDA leaf of the source: synchronous copy
        return leaf

    def ready(self) -> None:
        pass

    def close(self) -> None:
        pass


class CudaDelivery:
    """``device=torch.device('cuda', i)``: each leaf staged in pinned memory, a
    non-blocking copy on a stream of our own, one event per batch waited for
    (GIL released) before the batch is handed out."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        # The stream the consumer computes on (the constructor runs on its thread).
        self.consumer_stream = torch.cuda.current_stream(device)
        self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.staged: list[torch.Tensor] = []   # pinned buffers of this batch, until ready()
        self.moved = False

    def deliver(self, leaf: Any) -> Any:
        leaf = as_tensor(leaf)
        if not isinstance(leaf, torch.Tensor) or leaf.device == self.device:
            return leaf
        with torch.cuda.stream(self.stream):
            if leaf.is_cpu:
                src = leaf.pin_memory()   # keeps strides (channels_last stays one memcpy)
                self.staged.append(src)
            else:
                src = leaf  # another GPU: peer copy, ordered on our stream
                self.stream.wait_stream(torch.cuda.current_stream(leaf.device))
            out = src.to(self.device, non_blocking=True)
        out.record_stream(self.consumer_stream)
        self.moved = True
        return out

    def ready(self) -> None:
        if self.moved:
            self.event.record(self.stream)
            self.event.synchronize()   # releases the GIL while it waits
            self.moved = False
        self.staged.clear()   # back to torch's pinned cache, copies done

    def close(self) -> None:
        # The queued batches were dropped: wait for their frees, then hand
        # the cached blocks nobody holds back to the driver.
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


class PinnedHost(CpuDelivery):
    """``device=`` of the Loader behind ``prefetch.torch.DataLoader(pin_memory=True)``:
    the batches stay on the host, each tensor leaf (a numpy leaf as a tensor
    first) copied into pinned memory of the current accelerator on the
    publisher thread, as torch's pin-memory thread copies it, so that the
    consumer's ``.to(device, non_blocking=True)`` is asynchronous. It holds
    nothing, so it is its own Delivery: other leaves pass unchanged."""

    def __repr__(self) -> str:
        return "PinnedHost()"

    def deliver(self, leaf: Any) -> Any:
        leaf = as_tensor(leaf)
        if isinstance(leaf, torch.Tensor) and leaf.is_cpu:
            return leaf.pin_memory()
        return leaf


def open_device(device: torch.device) -> CpuDelivery | CudaDelivery:
    """The Delivery for ``device=`` (prefetch.register_device); ValueError naming it."""
    if device.type == "cpu":
        return CpuDelivery()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r}: CUDA is not available (torch {torch.__version__}: "
                "torch.cuda.is_available() is False); use torch.device('cpu') or None")
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= count:
            raise ValueError(f"device={device!r}: this torch sees {count} CUDA device(s)")
        return CudaDelivery(torch.device("cuda", index))
    raise ValueError(
        f"device={device!r}: prefetch.torch delivers to 'cpu' and 'cuda' devices only")


def device_hint(name: str) -> str | None:
    """What to pass as device= instead of the string ``name``, or None (not a torch device name)."""
    kind = name.strip().lower().partition(":")[0]
    return f"torch.device({name!r}) (PyTorch)" if kind in ("cuda", "cpu") else None


register_device(torch.device, open_device, hint=device_hint)
# Only the DataLoader passes one, and only where torch sees an accelerator.
register_device(PinnedHost, lambda host: host)
