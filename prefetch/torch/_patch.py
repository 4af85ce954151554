"""``patch()``/``unpatch()``: code that builds torch's ``DataLoader`` (or
torchdata's ``StatefulDataLoader``) builds the drop-in instead, for the
libraries and scripts that make loaders themselves (Accelerate's
``prepare()``, the Hugging Face ``Trainer``, Lightning's re-instantiation).

The classes are replaced where they are defined and where torch exports
them, and every name already bound to them in a module imported before the
call (``from torch.utils.data import DataLoader`` at a library's import) is
rebound too, so the order of imports does not matter. ``unpatch()`` puts
back exactly what ``patch()`` replaced, names included.
"""
from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

from prefetch.torch._dataloader import DataLoader
from prefetch.torch._torch import torch

# Where each class lives (module, attribute); torchdata's only where torchdata is installed.
_HOMES = {
    "torch": (("torch.utils.data", "DataLoader"), ("torch.utils.data.dataloader", "DataLoader")),
    "torchdata": (("torchdata.stateful_dataloader", "StatefulDataLoader"),
                  ("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader")),
}
_lock = threading.Lock()
_replaced: list[tuple[Any, str, Any]] = []   # (module, name, what it held): what unpatch() restores


def _originals() -> list[Any]:
    """The classes patch() replaces: torch's DataLoader, torchdata's StatefulDataLoader if installed."""
    found = [torch.utils.data.DataLoader]
    try:
        module = importlib.import_module(_HOMES["torchdata"][0][0])
    except ImportError:
        return found
    found.append(module.StatefulDataLoader)
    return found


def patch() -> type[DataLoader]:
    """From now on, code that builds ``torch.utils.data.DataLoader`` (or
    torchdata's ``StatefulDataLoader``) builds ``prefetch.torch.DataLoader``:
    loading on threads of this process. Modules that imported the class
    before this call see the drop-in too. Calling it again changes nothing;
    ``unpatch()`` restores torch's (and torchdata's) classes. Arguments the
    drop-in does not accept (torchdata's ``snapshot_every_n_steps``) fail in
    that call, naming them: never a silent fall-back to processes."""
    with _lock:
        if _replaced:
            return DataLoader
        originals = _originals()
        for homes in _HOMES.values():
            for module_name, name in homes:
                module = sys.modules.get(module_name)
                if module is not None and getattr(module, name, None) in originals:
                    _replace(module, name)
        # Names bound to them elsewhere, before this call (a library's own import).
        for module in list(sys.modules.values()):
            space = getattr(module, "__dict__", None)
            if module is None or not isinstance(space, dict) or module.__name__.startswith("prefetch"):
                continue
            for name, value in list(space.items()):
                if any(value is cls for cls in originals):
                    _replace(module, name)
    return DataLoader


def _replace(module: Any, name: str) -> None:
    _replaced.append((module, name, getattr(module, name)))
    setattr(module, name, DataLoader)


def unpatch() -> None:
    """Undo ``patch()``: every name it rebound holds what it held before
    (unless something else rebound it since). A no-op when not patched."""
    with _lock:
        while _replaced:
            module, name, was = _replaced.pop()
            if getattr(module, name, None) is DataLoader:
                setattr(module, name, was)
