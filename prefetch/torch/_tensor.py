"""``torch.Tensor`` leaves, registered on import.

A CPU tensor is copied by the core: its memory is seen as a numpy array (no
copy), ``plan.array`` gives a pool block that the core fills later in the
batch without the GIL, and ``torch.from_numpy`` wraps that block, so the
tensor handed out owns the block and it goes back to the pool only when torch
frees the tensor.

What comes out (the README says the same):
- a plain ``torch.Tensor`` with the input's shape, dtype and values, its own
  storage, ``requires_grad=False`` and no ``grad_fn`` (copied by value, as
  ``t.detach().clone()``); a ``torch.nn.Parameter`` (or ``Buffer``) comes out
  as such a plain tensor;
- C-contiguous (``torch.contiguous_format``), except a ``channels_last``
  (``channels_last_3d``) input, which keeps its layout: it is a permuted
  contiguous tensor, so it is copied as one memcpy and permuted back;
- a tensor subclass without its own ``__torch_dispatch__`` (plain Python
  subclasses such as torchvision's tv_tensors) keeps its type and a shallow
  copy of its ``__dict__``; one whose ``__dict__`` holds an array would be
  shared with the source, so it is refused, as are wrapper subclasses;
- a CUDA tensor is cloned on its device (stream-ordered, like ``clone()``).
Sparse, quantized, nested, meta and other-device tensors raise a TypeError
naming what they are: the core cannot read their memory as one block.

Exclusivity (hand-over without a copy) is never claimed: the tensor's Python
refcount says nothing about its storage, which other tensors (views), numpy
arrays (``from_numpy``/``.numpy()``) or DLPack consumers may share, and
torch exposes none of that cheaply, so every tensor is copied.

Threading contract: ``copy_tensor`` runs on a prefetcher's fetch thread with
the GIL held.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from prefetch.adapters import register_leaf
from prefetch.torch._torch import torch

Tensor = torch.Tensor

# Dtypes numpy has no equivalent for: their bytes travel as an integer dtype
# of the same item size (a view, no copy), and the copy is viewed back.
_BY_ITEMSIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_DTYPES = frozenset((
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.float32,
    torch.float64, torch.complex64, torch.complex128))
_VIEW_AS = {dt: _BY_ITEMSIZE[dt.itemsize] for dt in (
    getattr(torch, name, None) for name in (
        "bfloat16", "complex32", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
        "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"))
    if dt is not None}

# ndim -> (memory format, permutation to contiguous, permutation back)
_CHANNELS_LAST = {
    4: (torch.channels_last, (0, 2, 3, 1), (0, 3, 1, 2)),
    5: (torch.channels_last_3d, (0, 2, 3, 4, 1), (0, 4, 1, 2, 3)),
}
_STRIDED = torch.strided
_PLAIN_TYPES = frozenset(t for t in (Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", None)) if t)


def copy_tensor(t: Tensor, plan: Any) -> Tensor:
    """Leaf hook (prefetch.register_leaf): a fresh tensor with ``t``'s shape,
    dtype and values, over a pool block the core fills without the GIL."""
    cls = type(t)
    if cls is not Tensor:
        return _copy_subclass(t, cls, plan)
    if not t.is_cpu or t.layout is not _STRIDED:
        return _copy_unusual(t)
    if t.requires_grad:
        t = t.detach()
    back: tuple[int, ...] | None = None
    # Quantized and nested tensors fail in .numpy() below (diagnosed there):
    # checking them here would cost every tensor (a tiny batch's budget is ~1 µs a leaf).
    if not t.is_contiguous() and not t.is_nested:
        fmt = _CHANNELS_LAST.get(t.dim())
        if fmt is not None and t.is_contiguous(memory_format=fmt[0]):
            t = t.permute(fmt[1])   # contiguous: one memcpy instead of a strided copy
            back = fmt[2]
    view = _VIEW_AS.get(t.dtype)
    try:
        src = (t if view is None else t.view(view)).numpy()
    except (RuntimeError, TypeError) as exc:
        if t.is_quantized or t.is_nested:
            return _copy_unusual(t)
        if not (t.is_conj() or t.is_neg()):
            raise TypeError(f"prefetch cannot copy a torch.Tensor of dtype {t.dtype}: {exc}") from exc
        # A lazy conjugate/negative view: torch materialises it into a tensor
        # of its own, which nothing else can reach (not pooled; rare). It does
        # not go through plan.array: the plan would copy from it after it died.
        out = t.resolve_conj().resolve_neg().contiguous()
        return out if back is None else out.permute(back)
    out = torch.from_numpy(plan.array(src))   # keeps the pool array (and its block) alive
    if view is not None:
        out = out.view(t.dtype)
    if back is not None:
        out = out.permute(back)
    return out


def _describe(t: Tensor) -> str:
    return f"a {type(t).__module__}.{type(t).__qualname__} (layout {t.layout}, dtype {t.dtype}, device {t.device})"


def _copy_unusual(t: Tensor) -> Tensor:
    """Tensors whose memory is not one CPU block the core can read."""
    if t.is_cuda and t.layout is torch.strided and not t.is_quantized and not t.is_nested:
        # Cloned by torch on the tensor's current stream: the consumer's work on
        # that stream (and the source's later writes) are ordered after it.
        return t.detach().clone(memory_format=torch.contiguous_format)
    if t.layout is not torch.strided:
        what = "sparse tensors are not supported (convert with .to_dense())"
    elif t.is_quantized:
        what = "quantized tensors are not supported (convert with .dequantize() or .int_repr())"
    elif t.is_nested:
        what = "nested tensors are not supported (convert with .unbind() or .to_padded_tensor())"
    else:
        what = f"tensors on {t.device.type!r} devices are not supported (only CPU and CUDA)"
    raise TypeError(f"prefetch cannot copy {_describe(t)}: {what}")


def _copy_subclass(t: Tensor, cls: type, plan: Any) -> Tensor:
    if cls in _PLAIN_TYPES:
        return copy_tensor(t.as_subclass(Tensor), plan)
    if cls.__torch_dispatch__ is not Tensor.__torch_dispatch__:  # type: ignore[attr-defined]
        # A wrapper subclass (FakeTensor, DTensor, ...): its data is not its storage.
        raise TypeError(
            f"prefetch cannot copy {_describe(t)}: it overrides __torch_dispatch__; "
            f"tell prefetch how with prefetch.register_leaf({cls.__qualname__}, copy)")
    state = dict(getattr(t, "__dict__", {}))
    for key, value in state.items():
        if isinstance(value, (Tensor, np.ndarray)):
            raise TypeError(
                f"prefetch cannot copy {_describe(t)}: its attribute {key!r} holds an array, "
                f"which would be shared with the source; tell prefetch how with "
                f"prefetch.register_leaf({cls.__qualname__}, copy)")
    out: Tensor = copy_tensor(t.as_subclass(Tensor), plan).as_subclass(cls)
    out.__dict__.update(state)
    return out


register_leaf(Tensor, copy_tensor)
