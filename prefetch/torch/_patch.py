"""``patch()``/``unpatch()``: code that builds torch's ``DataLoader`` (or
torchdata's ``StatefulDataLoader``) builds the drop-in instead, for the
libraries and scripts that make loaders themselves (docs/pytorch.md says
which names are rebound and which are kept).

What takes a class's place is a stand-in (``_StandIn``): a subclass of the
drop-in made once per class and named here (``prefetch.torch._patch.DataLoader``),
so it and its loaders pickle by name in any process.
"""
from __future__ import annotations

import importlib
import threading
import warnings
from typing import Any

from prefetch.torch._bindings import module_bindings
from prefetch.torch._dataloader import DataLoader as _DropIn
from prefetch.torch._dataloader import StatefulDataLoader as _StatefulDropIn

# Where each class patch() replaces is defined (never rebound there), and the drop-in building it.
_HOMES = {"DataLoader": ("torch.utils.data.dataloader", _DropIn),
          "StatefulDataLoader": ("torchdata.stateful_dataloader.stateful_dataloader", _StatefulDropIn)}

_lock = threading.RLock()   # _stand_in() also runs under it, from patch() and from an unpickling
_patched = False


def original(name: str = "DataLoader") -> type:
    """torch's own class, patched or not: ``original("DataLoader")`` is
    ``torch.utils.data.DataLoader`` as torch defines it (loading in worker
    processes), ``original("StatefulDataLoader")`` torchdata's (ImportError
    where torchdata is not installed)."""
    if name not in _HOMES:
        raise ValueError(f"original() gives 'DataLoader' or 'StatefulDataLoader', got name={name!r}")
    return getattr(importlib.import_module(_HOMES[name][0]), name)  # type: ignore[no-any-return]


class _StandIn(type):
    """The metaclass of what patch() puts in a class's place: the drop-in, for
    which isinstance/issubclass also answer for the class replaced (a loader
    made before the patch is still recognised). A class derived from a
    stand-in answers as any class does."""

    replaced: type

    def __instancecheck__(cls, obj: Any) -> bool:
        if "replaced" in vars(cls):
            return isinstance(obj, (cls.replaced, cls.__mro__[1]))
        return type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        if "replaced" in vars(cls):
            return issubclass(sub, (cls.replaced, cls.__mro__[1]))
        return type.__subclasscheck__(cls, sub)


def _stand_in(name: str) -> type:
    """The stand-in for torch's (torchdata's) class ``name``: made on first
    use and kept as this module's attribute ``name``, where pickle finds it."""
    with _lock:
        made = globals().get(name)
        if made is None:
            drop_in = _HOMES[name][1]
            made = _StandIn(name, (drop_in,), {"__module__": __name__, "__qualname__": name,
                                               "__doc__": drop_in.__doc__})
            made.replaced = original(name)
            globals()[name] = made
        return made


def __getattr__(name: str) -> type:
    # A stand-in unpickled in a process that has not patched (a spawned worker).
    if name in _HOMES:
        return _stand_in(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _installed() -> list[str]:
    """The classes patch() replaces: torch's DataLoader, torchdata's StatefulDataLoader if installed."""
    names = ["DataLoader"]
    try:
        original("StatefulDataLoader")
        names.append("StatefulDataLoader")
    except ImportError:
        pass
    return names


def patch() -> type:
    """From now on, code that builds ``torch.utils.data.DataLoader`` (or
    torchdata's ``StatefulDataLoader``) builds ``prefetch.torch.DataLoader``:
    loading on threads of this process. Modules that imported the class
    under its own name before this call see the drop-in too. Calling it again
    changes nothing; ``unpatch()`` restores torch's (and torchdata's)
    classes. Arguments the drop-in does not accept fail in that call, naming
    them: never a silent fall-back to processes.

    torch's own class stays reachable: ``prefetch.torch.original("DataLoader")``
    (and ``original("StatefulDataLoader")``), a name of another spelling
    kept before the call (``TorchDL = torch.utils.data.DataLoader``: never
    rebound), or, per loader, the drop-in's ``loading="processes"``.
    Returns the stand-in now at ``torch.utils.data.DataLoader``."""
    global _patched
    with _lock:
        if not _patched:
            stand_ins = {original(name): _stand_in(name) for name in _installed()}
            for module, name, value in module_bindings(*stand_ins):
                if name == value.__name__ and getattr(module, "__name__", None) != value.__module__:
                    setattr(module, name, stand_ins[value])
            _patched = True
        return _stand_in("DataLoader")


def unpatch() -> None:
    """Undo ``patch()``: every module-level name that holds a stand-in (those
    ``patch()`` rebound, and those imported while patched) holds torch's
    (torchdata's) class again. A no-op when not patched. What it cannot undo
    it says, in a ``UserWarning``: classes defined while patched that derive
    from the stand-in (they still build the drop-in), and names it could not
    set. Loaders already built stay what they are."""
    global _patched
    with _lock:
        if not _patched:
            return
        stand_ins = [_stand_in(name) for name in _installed()]
        unset: list[str] = []
        for module, name, value in module_bindings(*stand_ins):
            try:
                setattr(module, name, value.replaced)
            except (AttributeError, TypeError):
                unset.append(f"{getattr(module, '__name__', module)!s}.{name}")
        _patched = False
    derived = [f"{sub.__module__}.{sub.__qualname__}"  # type: ignore[var-annotated]
               for cls in stand_ins for sub in type.__subclasses__(cls)]
    said = [f"{', '.join(derived)}, defined while patched, derive from the stand-in and still build "
            "prefetch.torch's drop-in (define them again to derive from torch's class)"] if derived else []
    if unset:
        said.append(f"{', '.join(unset)} could not be set back to torch's class")
    if said:
        warnings.warn(f"unpatch(): {'; '.join(said)}", UserWarning, stacklevel=2)
