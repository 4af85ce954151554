"""Each worker's copy of the dataset, as a framework's worker processes hold one.

A worker process of a framework's ``DataLoader`` loads from its own copy
of the dataset: whatever ``dataset[i]``, ``__iter__`` or a worker
init function sets on it (a file handle opened on first use, a worker's
shard bounds) is that worker's alone. On threads the same holds through a
shallow copy per worker: attributes set on the copy stay the worker's, while
the objects the dataset refers to (arrays, lists, caches, a memory map) are
shared, not duplicated. Datasets inside it (instances of the framework's
dataset classes: a subset's dataset, the datasets a concatenation
holds, a wrapper's attribute, in a list, tuple or dict) are copied
the same way, so a handle opened lazily by an inner dataset is per worker too.

A dataset that cannot be copied (its ``__reduce_ex__`` or ``__getattr__``
raises on a bare copy) is shared by the workers, as one is with a single
main-process worker.
"""
from __future__ import annotations

import copy
import itertools
from typing import Any


def replica(dataset: Any, kinds: tuple[type, ...]) -> Any:
    """A worker's copy of ``dataset``, with every instance of ``kinds`` (the
    framework's dataset classes) in it copied; the dataset itself if it
    cannot be copied."""
    try:
        return _copy(dataset, kinds, {})
    except Exception:
        return dataset


def _copy(obj: Any, kinds: tuple[type, ...], memo: dict[int, Any]) -> Any:
    """``obj`` with each dataset in it shallow-copied, once each (``memo``
    keeps a dataset reached twice one copy); other objects are kept as they
    are, and containers are rebuilt only around a copy."""
    found = memo.get(id(obj))
    if found is not None:
        return found
    if isinstance(obj, kinds):
        new = copy.copy(obj)
        memo[id(obj)] = new
        if new is obj:   # its __copy__ says it is shared
            return new
        fields = getattr(new, "__dict__", None)
        if fields is not None:
            for name, value in list(fields.items()):
                fields[name] = _copy(value, kinds, memo)
        return new
    kind = type(obj)
    if (kind is list or kind is tuple) and _searched(len(obj), obj[:1], kinds):
        items = [_copy(v, kinds, memo) for v in obj]
        if any(a is not b for a, b in zip(items, obj)):
            return kind(items)
    elif kind is dict and _searched(len(obj), list(itertools.islice(obj.values(), 1)), kinds):
        values = {k: _copy(v, kinds, memo) for k, v in obj.items()}
        if any(values[k] is not v for k, v in obj.items()):
            return values
    return obj


_SEARCHED = 256   # items of a container searched whatever they are


def _searched(n: int, first: list[Any], kinds: tuple[type, ...]) -> bool:
    """A container of ``n`` items starting with ``first`` (a list of at most
    one) is searched when short, or when its first item is a dataset (a
    ConcatDataset of many); not a long one of anything else (a Subset's
    million indices)."""
    return n <= _SEARCHED or isinstance(first[0], kinds)
