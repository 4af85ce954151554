"""Warnings that point at the user's line, not at prefetch's own frames.

A fixed ``stacklevel`` cannot: the same warning is reached through ``close()``,
``with``, a drop-in's ``close()`` or a finalizer, and when the stack is shorter
than the level Python reports ``sys:1``.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
import warnings
import weakref
from typing import Iterator, Optional

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames that are machinery between prefetch and the user (finalizers, atexit hooks,
# a framework's loader calling its drop-in: see machinery()).
_MACHINERY = {os.path.abspath(f) for f in (weakref.__file__,) if f}
_MACHINERY_DIRS: tuple[str, ...] = ()

Location = tuple[str, int]


def machinery(folder: str) -> None:
    """Frames of the modules in ``folder`` (a framework's, whose code calls a
    drop-in's, as a framework loader's ``__iter__`` calls its drop-in's
    ``_get_iterator``) are passed over as prefetch's own: a warning points
    past them."""
    global _MACHINERY_DIRS
    _MACHINERY_DIRS += (os.path.abspath(folder) + os.sep,)


def user_frame() -> Optional[types.FrameType]:
    """The innermost frame of the caller's stack that is not prefetch's own; None if there is none."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not (name.startswith(_PACKAGE) or name in _MACHINERY or name.startswith(_MACHINERY_DIRS)):
            break
        frame = frame.f_back
    return frame


def user_location() -> Optional[Location]:
    """(filename, line) of the user's call, for a warning that comes later (at collection)."""
    frame = user_frame()
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno)


_pointing = threading.local()   # .at: where this thread's warnings point for now (pointing_at)


@contextlib.contextmanager
def pointing_at(at: Optional[Location]) -> Iterator[None]:
    """Warnings given on this thread inside it point at ``at`` (where the
    object a finalizer closes was created): the line on the stack then is
    whatever ran when the collector did, or none at all (interpreter exit)."""
    before = getattr(_pointing, "at", None)
    _pointing.at = at
    try:
        yield
    finally:
        _pointing.at = before


def warn(message: str, category: type[Warning], at: Optional[Location] = None) -> None:
    """Warn at ``at`` when given (where the object was created), else at the user's line on
    the stack; with neither (a finalizer at exit), at the innermost frame there is."""
    if at is None:
        at = getattr(_pointing, "at", None)
    if at is None:
        frame = user_frame()
        if frame is None:
            warnings.warn(message, category, stacklevel=2)
            return
        warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                               module=frame.f_globals.get("__name__", "<unknown>"),
                               registry=frame.f_globals.setdefault("__warningregistry__", {}))
        return
    warnings.warn_explicit(message, category, at[0], at[1])


# A prefetch thread that consumes another prefetcher (a Prefetcher over a
# Loader: its publisher calls the loader's next()) relays that one's warnings
# to its own consumer instead of warning on itself: there the warning would
# point at threading.py, and with warnings as errors it would end the epoch.
_relay = threading.local()


def relay_into(pending: Optional[list[tuple[str, type[Warning]]]]) -> None:
    """On a prefetch thread: the warnings for its consumer go to ``pending`` (None: warn here)."""
    _relay.pending = pending


def warn_consumer(message: str, category: type[Warning]) -> None:
    """Warn the consumer at its line: here, or, on a prefetch thread, at its own consumer's."""
    pending = getattr(_relay, "pending", None)
    if pending is not None:
        pending.append((message, category))
    else:
        warn(message, category)


def deliver(pending: list[tuple[str, type[Warning]]]) -> None:
    """The warnings relayed to this consumer, each once (popped before it is raised as an error)."""
    while pending:
        message, category = pending.pop(0)
        warn_consumer(message, category)
