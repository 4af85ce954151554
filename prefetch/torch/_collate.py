"""How a Loader's default collate stacks torch tensors: each sample's tensor
is read through a numpy view (a host copy first for a device tensor), copied
into its row of a pooled block, and the block becomes one tensor without a copy.

A dtype numpy lacks (``bfloat16``, the ``float8`` kinds, ``complex32``) is
read through an integer view of the same item size, as a one-field numpy
structured dtype named after the torch dtype; the block becomes the integer
tensor viewed back as that dtype. The bytes are copied as they are, and two
samples of different dtypes never share a column (their numpy dtypes differ).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from prefetch._framework import register_collate
from prefetch.torch._torch import torch

_INT = {1: (torch.uint8, "u1"), 2: (torch.int16, "<i2"), 4: (torch.int32, "<i4"), 8: (torch.int64, "<i8")}
_carrier_of: dict[Any, np.dtype] = {}   # torch dtype -> the numpy structured dtype carrying it
_carried: dict[np.dtype, Any] = {}      # the way back


def _carrier(t: Any) -> np.dtype:
    carrier = _carrier_of.get(t.dtype)
    if carrier is None:
        carrier = np.dtype([(str(t.dtype), _INT[t.element_size()][1])])
        _carried[carrier] = t.dtype
        _carrier_of[t.dtype] = carrier
    return carrier


def tensor_as_numpy(t: Any) -> np.ndarray:
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.detach().resolve_conj().resolve_neg()
    try:
        return t.numpy()
    except TypeError:   # a dtype numpy lacks
        if t.element_size() not in _INT or t.is_quantized:
            raise
        return t.view(_INT[t.element_size()][0]).numpy().view(_carrier(t))


def block_as_tensor(block: np.ndarray) -> Any:
    if block.dtype.names is not None:
        dtype = _carried.get(block.dtype)
        if dtype is not None:
            return torch.from_numpy(block.view(block.dtype[0])).view(dtype)
    return torch.from_numpy(block)


register_collate(torch.Tensor, tensor_as_numpy, block_as_tensor)
