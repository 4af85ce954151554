"""Each worker's copy of the dataset, as a framework's worker processes hold
one (docs/dropins.md): a shallow copy per worker, so what ``dataset[i]``,
``__iter__`` or a worker init function sets on it is that worker's alone,
while the objects it refers to (arrays, caches, a memory map) are shared.
The framework's datasets inside it, and what a drop-in names besides (a file
reader threads cannot share, and whatever holds one), are copied by the same
walk; a dataset that cannot be copied (its ``__reduce_ex__`` or
``__getattr__`` raises on a bare copy) is shared by the workers.
"""
from __future__ import annotations

import copy
import copyreg
from typing import Any, Callable, Mapping, Optional

Along = Mapping[int, Optional[Callable[[Any], Any]]]


def replica(dataset: Any, kinds: tuple[type, ...], along: Optional[Along] = None) -> Any:
    """A worker's copy of ``dataset``, with every instance of ``kinds`` (the
    framework's dataset classes) in it copied; the dataset itself if it
    cannot be copied.

    ``along`` names more objects in it to copy, whatever they are (a user's
    own wrapper, a container of any size), by id: each with the function
    that copies it (a framework's file reader, which no two threads may
    share: a reader with a handle of its own), or None (what holds one:
    copied as a dataset is). Those are copied even where a dataset cannot be
    (the datasets are shared then), and an error in copying them is the
    caller's."""
    along = along or {}
    try:
        return _copy(dataset, kinds, along, {})
    except Exception:
        if not along:
            return dataset
    return _copy(dataset, (), along, {})


def _copy(obj: Any, kinds: tuple[type, ...], along: Along, memo: dict[int, Any]) -> Any:
    """``obj`` with each object to copy in it copied, once each (``memo``
    keeps one reached twice one copy); other objects are kept as they are,
    and containers are rebuilt only around a copy."""
    found = memo.get(id(obj))
    if found is not None:
        return found
    named = id(obj) in along
    copier = along.get(id(obj))
    if copier is not None:
        new = memo[id(obj)] = copier(obj)
        return new
    container = isinstance(obj, (list, tuple, dict))
    if isinstance(obj, kinds) or (named and not container):
        new = copy.copy(obj)
        memo[id(obj)] = new
        if new is obj:   # its __copy__ says it is shared
            return new
        fields = getattr(new, "__dict__", None)
        if fields is not None:
            for name, value in list(fields.items()):
                fields[name] = _copy(value, kinds, along, memo)
        return new
    if not container or not (named or (type(obj) in (list, tuple, dict) and _searched(obj, kinds))):
        return obj
    memo[id(obj)] = obj   # a cycle back to it keeps the original
    pairs = obj.items() if isinstance(obj, dict) else enumerate(obj)
    copies = {key: new for key, value in pairs if (new := _copy(value, kinds, along, memo)) is not value}
    if not copies:
        return obj
    if isinstance(obj, tuple):   # of its own type (a namedtuple's own)
        items = [copies.get(i, value) for i, value in enumerate(obj)]
        own = obj._make(items) if hasattr(obj, "_make") else type(obj)(items)
    else:
        own = copy.copy(obj)
        for key, new in copies.items():
            own[key] = new
    memo[id(obj)] = own
    return own


def for_processes(dataset: Any, kinds: tuple[type, ...]) -> Any:
    """``dataset`` for worker processes forked after threads ran it: a shallow copy with its
    attributes kept in the object. A thread's copy of one of ``kinds`` (``copy.copy``) moved
    the original's into a dict of its own, which CPython 3.11 reads more slowly in every
    ``dataset[i]`` (12-19 % more CPU a batch on a pure-Python dataset). The dataset itself
    where no thread copied it, or its class copies or pickles in a way of its own."""
    cls: Any = type(dataset)
    state = getattr(dataset, "__dict__", None) if isinstance(dataset, kinds) else None
    if (type(state) is not dict or copyreg._slotnames(cls)   # type: ignore[attr-defined]  # as copy.copy reads slots
            or any(hasattr(cls, name) for name in ("__copy__", "__setstate__", "__getnewargs__", "__getnewargs_ex__"))
            or any(getattr(cls, name, None) is not getattr(object, name, None)
                   for name in ("__reduce_ex__", "__reduce__", "__getstate__"))
            or any(hasattr(type(getattr(cls, name, None)), "__set__") for name in state)):   # a property's
        return dataset
    new = cls.__new__(cls)
    for name, value in state.items():
        object.__setattr__(new, name, value)
    return new


_SEARCHED = 256   # items of a container searched whatever they are


def _searched(obj: Any, kinds: tuple[type, ...]) -> bool:
    """A plain list, tuple or dict ``along`` does not name is searched for
    datasets when short, or when its first item is a dataset (a
    ConcatDataset of many); not a long one of anything else (a Subset's
    million indices)."""
    first = next(iter(obj.values() if type(obj) is dict else obj), None)
    return bool(kinds) and (len(obj) <= _SEARCHED or isinstance(first, kinds))
