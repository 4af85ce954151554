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
from prefetch.torch._tensor import VIEW_AS
from prefetch.torch._torch import torch

_carrier_of: dict[Any, np.dtype] = {}   # torch dtype -> the numpy structured dtype carrying it
_carried: dict[np.dtype, Any] = {}      # the way back


def tensor_as_numpy(t: Any) -> np.ndarray:
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.detach().resolve_conj().resolve_neg()
    view = VIEW_AS.get(t.dtype)
    if view is None:
        return t.numpy()   # a dtype numpy lacks, not carried (quantized...): its TypeError
    carrier = _carrier_of.get(t.dtype)
    if carrier is None:
        carrier = np.dtype([(str(t.dtype), torch.empty(0, dtype=view).numpy().dtype)])
        _carried[carrier] = t.dtype
        _carrier_of[t.dtype] = carrier
    return t.view(view).numpy().view(carrier)


def block_as_tensor(block: np.ndarray) -> Any:
    if block.dtype.names is not None:
        dtype = _carried.get(block.dtype)
        if dtype is not None:
            return torch.from_numpy(block.view(block.dtype[0])).view(dtype)
    return torch.from_numpy(block)


register_collate(torch.Tensor, tensor_as_numpy, block_as_tensor)
