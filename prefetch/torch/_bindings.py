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


def module_bindings(*targets: Any) -> Iterator[tuple[types.ModuleType, str, Any]]:
    """(module, name, value) for each name of a loaded module bound to one of
    ``targets`` (by identity). This package's modules (``prefetch``,
    ``prefetch.*``, not ``prefetch_data``) hold them on purpose: never listed."""
    wanted = {id(t) for t in targets}   # alive while we look: an id is theirs alone
    for module_name, module in list(sys.modules.items()):
        space = getattr(module, "__dict__", None)
        if not isinstance(space, dict) or str(module_name).partition(".")[0] == "prefetch":
            continue
        for name, value in list(space.items()):
            if id(value) in wanted:
                yield module, name, value
