"""What the drop-ins' hand-over to their framework's own worker processes
shares (each adapter folder's _processes.py): the start
method those processes would use, whether what they need pickles, and the
one warning that says what the DataLoader did on the GIL notice and why.
Framework-free: each drop-in names its framework and what stays the same.
"""
from __future__ import annotations

import multiprocessing
from multiprocessing.reduction import ForkingPickler
from typing import Any, Optional

from prefetch._types import GILBoundWarning
from prefetch._warn import warn_consumer


def start_method(context: Any = None) -> str:
    """The start method of ``context`` (a multiprocessing context), else the process's."""
    if context is not None:
        return str(context.get_start_method())
    # Not multiprocessing.get_start_method() without allow_none: that would fix the default.
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def unpicklable(what: str, objects: tuple[Any, ...], needed_by: str) -> Optional[str]:
    """Why ``objects`` (``what`` names them) cannot go to worker processes
    that pickle them (``needed_by`` says which do); None where they pickle."""
    try:
        ForkingPickler.dumps(objects)
    except Exception as exc:
        return f"its {what} cannot be pickled, as {needed_by} needs ({type(exc).__name__}: {exc})"
    return None


def say_handover(note: Any, reason: Optional[str], *, framework: str, loader: str, workers: int,
                 method: str, same: str, cannot_run: bool = True) -> None:
    """The one warning about the GIL notice ``note``, at the user's line:
    the DataLoader now loads with ``framework``'s own worker processes (the
    ones ``loader`` uses), or, with a ``reason``, stays on threads (where
    not ``cannot_run``, a reason other than those processes' inability to
    run the dataset)."""
    if reason is not None:
        cannot = f"{framework}'s worker processes cannot run it: " if cannot_run else ""
        message = f"{note} It stays on threads: {cannot}{reason}."
    else:
        message = (f"DataLoader: its {note.threads} threads ran dataset[i] about {note.parallelism:.1f} at a time "
                   f"({note.wait_share:.0%} of their time at work went to waiting for each other, on "
                   f"{note.cpus} CPUs): dataset[i] holds the GIL (it runs Python code), so threads take turns. "
                   f"It now loads with {framework}'s own worker processes ({workers}, start method "
                   f"{method!r}), as {loader} does: {same}; the batches its threads opened come first. "
                   "stats().loading shows it; loading='threads' keeps threads.")
    warning = GILBoundWarning(message)
    for name in ("parallelism", "wait_share", "threads", "cpus", "speedup"):
        setattr(warning, name, getattr(note, name, None))
    warn_consumer(warning, GILBoundWarning)   # type: ignore[arg-type]
