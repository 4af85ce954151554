"""``patch()``/``unpatch()``: code that builds torch's ``DataLoader`` (or
torchdata's ``StatefulDataLoader``) builds the drop-in instead, for the
libraries and scripts that make loaders themselves (Accelerate's
``prepare()``, the Hugging Face ``Trainer``, Lightning's re-instantiation).

The classes are replaced where they are defined and where torch exports
them, and every name already bound to them in a module imported before the
call (``from torch.utils.data import DataLoader`` at a library's import) is
rebound too, so the order of imports does not matter. What takes a class's
place is a stand-in: calling it builds the drop-in, and ``isinstance`` and
``issubclass`` against it answer for the class it replaced too, so a
library's ``isinstance(x, torch.utils.data.DataLoader)`` still recognises a
loader made before the patch (Accelerate's ``prepare()`` checks so).
``unpatch()`` puts back exactly what ``patch()`` replaced, names included.
"""
from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

from prefetch.torch._dataloader import DataLoader, StatefulDataLoader
from prefetch.torch._torch import torch

_lock = threading.Lock()
_replaced: list[tuple[Any, str, Any]] = []   # (module, name, what it held): what unpatch() restores


class _StandIn(type):
    """The metaclass of what patch() puts in a class's place: the drop-in, for
    which isinstance/issubclass also answer for the class replaced."""

    replaced: type

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, (cls.replaced, DataLoader))

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, (cls.replaced, DataLoader))


def _stand_in(original: type) -> type:
    """A subclass of the drop-in, named as ``original``, standing in for it."""
    base = StatefulDataLoader if original.__name__ == "StatefulDataLoader" else DataLoader
    cls = _StandIn(original.__name__, (base,), {"__module__": base.__module__,
                                                 "__qualname__": original.__qualname__,
                                                 "__doc__": base.__doc__})
    cls.replaced = original
    return cls


def _originals() -> list[type]:
    """The classes patch() replaces: torch's DataLoader, torchdata's StatefulDataLoader if installed."""
    found: list[type] = [torch.utils.data.DataLoader]
    try:
        found.append(importlib.import_module("torchdata.stateful_dataloader").StatefulDataLoader)
    except ImportError:
        pass
    return found


def patch() -> type:
    """From now on, code that builds ``torch.utils.data.DataLoader`` (or
    torchdata's ``StatefulDataLoader``) builds ``prefetch.torch.DataLoader``:
    loading on threads of this process. Modules that imported the class
    before this call see the drop-in too. Calling it again changes nothing;
    ``unpatch()`` restores torch's (and torchdata's) classes. Arguments the
    drop-in does not accept fail in that call, naming them: never a silent
    fall-back to processes."""
    with _lock:
        if not _replaced:
            stand_ins = {id(cls): _stand_in(cls) for cls in _originals()}
            # Where torch and torchdata keep them, and names bound to them
            # elsewhere before this call (a library's own import).
            for module in list(sys.modules.values()):
                space = getattr(module, "__dict__", None)
                if not isinstance(space, dict) or str(getattr(module, "__name__", "")).startswith("prefetch"):
                    continue
                for name, value in list(space.items()):
                    if id(value) in stand_ins and isinstance(value, type):
                        _replaced.append((module, name, value))
                        setattr(module, name, stand_ins[id(value)])
        return torch.utils.data.DataLoader  # type: ignore[no-any-return]


def unpatch() -> None:
    """Undo ``patch()``: every name it rebound holds what it held before
    (unless something else rebound it since). A no-op when not patched."""
    with _lock:
        while _replaced:
            module, name, was = _replaced.pop()
            if type(getattr(module, name, None)) is _StandIn:
                setattr(module, name, was)
