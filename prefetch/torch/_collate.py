"""torch's ``default_collate`` on the Loader's own collate. How it stacks
torch tensors: each sample's tensor is read through a numpy view (a host
copy first for a device tensor), copied into its row of a pooled block, and
the block becomes one tensor without a copy. ``as_torch`` then gives the
Loader's batch torch's types (the drop-in's default ``collate_fn``).

A dtype numpy lacks (``bfloat16``, the ``float8`` kinds, ``complex32``) is
read through an integer view of the same item size, as a one-field numpy
structured dtype named after the torch dtype; the block becomes the integer
tensor viewed back as that dtype. The bytes are copied as they are, and two
samples of different dtypes never share a column (their numpy dtypes differ).
"""
from __future__ import annotations

import collections.abc
import copy
from typing import Any

import numpy as np

from prefetch._framework import register_collate
from prefetch.torch._tensor import VIEW_AS
from prefetch.torch._torch import torch

_default_collate = torch.utils.data.default_collate

# torch dtype -> the numpy structured dtype carrying it, and the way back.
_CARRIER = {dt: np.dtype([(str(dt), torch.empty(0, dtype=view).numpy().dtype)]) for dt, view in VIEW_AS.items()}
_CARRIED = {carrier: dt for dt, carrier in _CARRIER.items()}


def tensor_as_numpy(t: Any) -> np.ndarray:
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.detach().resolve_conj().resolve_neg()
    carrier = _CARRIER.get(t.dtype)
    if carrier is None:
        return t.numpy()   # a dtype numpy lacks, not carried (quantized...): its TypeError
    return t.view(VIEW_AS[t.dtype]).numpy().view(carrier)


def block_as_tensor(block: np.ndarray) -> Any:
    dtype = _CARRIED.get(block.dtype)
    if dtype is not None:
        return torch.from_numpy(block.view(block.dtype[0])).view(dtype)
    return torch.from_numpy(block)


register_collate(torch.Tensor, tensor_as_numpy, block_as_tensor)


def _leaf_collection(obj: Any) -> bool:
    """A collection the Loader keeps whole (a leaf) and torch's
    default_collate takes apart: a Mapping that is no dict (a ``UserDict``,
    a read-only ``Mapping``), a Sequence that is no list, tuple or string
    (a ``range``, a ``UserList``)."""
    if isinstance(obj, collections.abc.Mapping):
        return not isinstance(obj, dict)
    return isinstance(obj, collections.abc.Sequence) and not isinstance(obj, (list, tuple, str, bytes))


_NODES = (list, tuple, dict, np.ndarray)
# Objects that are their own conversion: a column of them (the Loader's list of
# the samples' strings, say) is checked by type alone, not by the ABC checks
# below, which cost about a microsecond a sample.
_PLAIN = frozenset({str, bytes, type(None), int, float, bool, complex})


def _plain_column(batch: list) -> bool:
    return all(type(v) in _PLAIN for v in batch)


def _item(child: Any) -> Any:
    """A child of a sequence node: a column of objects (no node, no array
    among them: strings...) as the tuple torch gives; anything else converted."""
    if type(child) is list and child and (
            _plain_column(child) or not any(isinstance(v, _NODES) or _leaf_collection(v) for v in child)):
        return tuple(child)
    return as_torch(child)


def as_torch(batch: Any) -> Any:
    """A Loader-collated batch as torch's default_collate gives it: numpy
    arrays as tensors over the same memory, tuples as lists (torch's
    backwards compatibility); namedtuples, dicts, lists and strings kept.

    A dict or list subclass (which the Loader rebuilds as a node) keeps its
    type as torch's do (``copy.copy(batch)`` refilled, or a Mapping's
    constructor when immutable), a tuple subclass becomes a list; a column of
    leaf collections (``_leaf_collection``) is stacked by torch's
    default_collate here, on the consumer's thread. Inside a sequence, a
    column of strings (or other objects) is a tuple, as torch's
    ``zip(*batch)`` gives it; elsewhere a list."""
    t = type(batch)
    if t is np.ndarray:
        return torch.from_numpy(batch)
    if t is dict:
        return {k: as_torch(v) for k, v in batch.items()}
    if t is list:
        if _plain_column(batch):
            return batch   # a fresh column of the Loader's batch: nothing in it to convert
        if batch and all(_leaf_collection(v) for v in batch):
            # A leaf collection is one to the Loader: only a column holds those.
            return _default_collate(batch)
        return [_item(v) for v in batch]
    if isinstance(batch, tuple):
        items = [_item(v) for v in batch]
        return t(*items) if hasattr(batch, "_fields") else items
    if isinstance(batch, list):   # a subclass, rebuilt by the Loader with its type
        converted = [_item(v) for v in batch]
        try:
            clone = copy.copy(batch)
            for i, v in enumerate(converted):
                clone[i] = v
            return clone
        except TypeError:   # as torch
            return converted
    if isinstance(batch, collections.abc.Mapping):
        items = {k: as_torch(v) for k, v in batch.items()}
        try:
            if isinstance(batch, collections.abc.MutableMapping):
                clone = copy.copy(batch)
                clone.update(items)
                return clone
            return t(items)
        except TypeError:   # as torch: no copy()/update(mapping)/__init__(mapping)
            return items
    return batch
