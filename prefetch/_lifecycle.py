"""What ``Prefetcher`` and ``Loader`` share as objects: epochs of a compiled
``_Core``, the finalizer and its warning, ``close()``, ``with``, ``stats()``, no pickling.
Worker threads reference only the inner ``_Core`` (and a loader's stage), so
dropping the last reference to one of these runs its finalizer at once.
"""
from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable, Optional, TypeVar

from prefetch import _warn
from prefetch._core import _Core, _Iterator
from prefetch._types import Stats

_exiting = False   # set at interpreter exit: no ResourceWarning then
_exit_hook = False  # _at_exit registered


def _at_exit() -> None:
    global _exiting
    _exiting = True


def _collected(core: _Core, owned: tuple[Any, ...], kind: str, created_at: tuple[str, int]) -> None:
    """The finalizer of an object dropped without close(): close its core and
    what it owns (a loader's stage, the pool) and, if it was still running,
    warn where it was created, as an unclosed file does."""
    running = core.state == "running"
    message = f"unclosed {kind} {core.name!r}: call close() or use 'with'"
    # The epoch's core, then what outlives the epochs; a warning about a
    # stuck thread points at the creation line.
    with _warn.pointing_at(created_at):
        try:
            core.close(at=created_at)
        finally:
            for thing in owned:   # a loader's stage or batch copy, a device delivery, the pool
                thing.close()
    # Under -W error the warning is an exception whose traceback holds this
    # frame: it must not keep the core alive.
    del core
    if running and not _exiting:
        _warn.warn(message, ResourceWarning, created_at)


_C = TypeVar("_C", bound="Closing")


class Closing:
    """``with`` closes it: what every object that owns threads shares."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Lifecycle(_Iterator, Closing):
    """Base of Prefetcher and Loader: one ``_Core`` per epoch, started by
    ``_install``; ``_owned`` (a pool shared by the epochs, a loader's stage)
    outlives the epochs and is closed last."""

    _kind = "prefetcher"
    _closing = False   # close() was called: an epoch starting meanwhile closes too
    _owned: tuple[Any, ...] = ()
    _finalizer: "Optional[weakref.finalize[Any, Any]]" = None

    def _remember_caller(self) -> None:
        # Where the user created it (past a drop-in's or a loader's own
        # frames): where a warning about it points later.
        self._created_at = _warn.user_location() or ("<unknown>", 0)

    def _install(self, core: _Core, on_thread: tuple[Callable[[], None], ...] = ()) -> None:
        """Make ``core`` the current epoch's and start it; its publisher thread
        calls each of ``on_thread`` first (the creator's framework modes)."""
        # Started before it is made current: a thread joining the epoch meets
        # a publisher that runs or ran, never one still starting (Thread.start()
        # lets other threads run while it waits, and a thread not yet started
        # is not alive: it would pass for a dead one).
        try:
            core.start(on_thread)
        except BaseException:
            core.close()   # Ctrl-C inside start(): the thread may be running
            raise
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _collected, core, self._owned, self._kind,
                                           self._created_at)
        global _exit_hook
        if not _exit_hook:
            # Registered after weakref.finalize's own exit hook: atexit runs
            # hooks last-in first-out, so this one runs first.
            atexit.register(_at_exit)
            _exit_hook = True
        self._core = core

    def __reduce__(self) -> Any:
        raise TypeError(f"cannot pickle {self!r}: it owns threads and buffers; "
                        f"pickle what it reads from and build a new one instead")

    def close(self) -> None:
        """Stop the workers, drop unconsumed batches and free the buffers.

        Idempotent and safe from any thread and from a signal handler; it
        returns once that is done (a source stuck past a grace period: with a
        ``RuntimeWarning``, its thread left as a daemon). Batches the user
        still holds stay valid (docs/reliability.md, "Closing").
        """
        # No lock: a child forked while another thread held one could not
        # close. An epoch that __iter__ starts meanwhile sees the flag.
        self._closing = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._core is not None:
            # Cut short by Ctrl-C, it raises here: what outlives the epochs is
            # then closed by the next close(), once the threads are stopped.
            self._core.close()
        while self._owned:   # each closed once, however often close() is called
            thing, self._owned = self._owned[0], self._owned[1:]
            thing.close()

    @property
    def closed(self) -> bool:
        """True once ``close()`` has run."""
        return self._core is None or self._core.closed

    def stats(self) -> Stats:
        """A frozen snapshot of the counters (see ``prefetch.Stats``)."""
        if self._core is None:
            raise ValueError(f"{type(self).__name__}.__init__ did not complete")
        return Stats(**self._core.stats())
