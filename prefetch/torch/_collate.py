"""How a Loader's default collate stacks torch tensors: each sample's tensor
is read through a numpy view (a host copy first for a device tensor), copied
into its row of a pooled block, and the block becomes one tensor without a copy."""
from __future__ import annotations

from typing import Any

import numpy as np

from prefetch.adapters import register_collate
from prefetch.torch._torch import torch


def tensor_as_numpy(t: Any) -> np.ndarray:
    if t.device.type != "cpu":
        t = t.cpu()
    return t.detach().resolve_conj().resolve_neg().numpy()


register_collate(torch.Tensor, tensor_as_numpy, torch.from_numpy)
