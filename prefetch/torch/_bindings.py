"""The names that loaded modules bind to an object: what ``patch()`` and the
``get_worker_info`` hand-over rebind, so that code holding torch's object by
a name it imported earlier sees the replacement too.

A module's own namespace is all that can be reached: a reference kept
elsewhere (an attribute of an object, a closure, a default argument) is not
a binding found here.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Iterator


def ours(module_name: str) -> bool:
    """A module of this package (``prefetch``, ``prefetch.*``): never rebound.
    Another package whose name begins the same (``prefetch_data``) is not ours."""
    return module_name == "prefetch" or module_name.startswith("prefetch.")


def module_bindings(*targets: Any) -> Iterator[tuple[types.ModuleType, str, Any]]:
    """(module, name, value) for each name of a loaded module (not ours)
    bound to one of ``targets`` (by identity)."""
    wanted = {id(t): t for t in targets}
    for module_name, module in list(sys.modules.items()):
        space = getattr(module, "__dict__", None)
        if not isinstance(space, dict) or ours(str(module_name)):
            continue
        for name, value in list(space.items()):
            if id(value) in wanted and wanted[id(value)] is value:
                yield module, name, value
