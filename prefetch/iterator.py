"""``Prefetcher``: the user-facing iterator over the compiled core.

This layer owns what users touch: argument checks, ``repr``, the context
manager and the finalizer. The fetch thread references only the inner
``_Core``, so dropping the last reference to a ``Prefetcher`` runs its
finalizer at once, which closes the core and joins the thread.
"""
from __future__ import annotations

import atexit
import itertools
import math
import numbers
import weakref
from typing import TYPE_CHECKING, Any, Generic, Iterable, Iterator, Optional, Sized, TypeVar

from prefetch import _warn, adapters
from prefetch._core import _Core, _Iterator
from prefetch._types import Stats

_names = itertools.count(1)
T = TypeVar("T")


# Upper bounds: a ring slot per depth, a thread per worker; past these a
# value is a mistake, not a configuration.
MAX_DEPTH = 1 << 20
MAX_WORKERS = 256
MAX_BYTES = (1 << 63) - 1
_exit_hook = False  # _at_exit registered


def _check_int(arg: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{arg} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    number = int(value)
    if not minimum <= number <= maximum:
        raise ValueError(f"{arg} must be an int >= {minimum} and <= {maximum}, got {value!r}")
    return number


COPY_MODES = ("auto", "always")


def _check_copy(value: Any) -> bool:
    """True when leaves may be handed over (copy="auto")."""
    if not isinstance(value, str):
        raise TypeError(f"copy must be 'auto' or 'always', got {value!r} ({type(value).__name__})")
    if value not in COPY_MODES:
        raise ValueError(f"copy must be 'auto' or 'always', got {value!r}")
    return value == "auto"


def _check_timeout(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {value!r} ({type(value).__name__})")
    seconds = float(value)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {value!r}")
    return seconds


_exiting = False   # set at interpreter exit: no ResourceWarning then


def _at_exit() -> None:
    global _exiting
    _exiting = True


def _collected(core: _Core, created_at: tuple[str, int]) -> None:
    """The finalizer of a Prefetcher dropped without close(): close its core
    (joins the thread, frees the pool) and, if it was still running, warn
    where it was created, as an unclosed file does."""
    running = core.state == "running"
    message = f"unclosed prefetcher {core.name!r}: call close() or use 'with Prefetcher(...)'"
    core.close(at=created_at)
    # Under -W error the warning is an exception whose traceback holds this
    # frame: it must not keep the core alive.
    del core
    if running and not _exiting:
        _warn.warn(message, ResourceWarning, created_at)


class Prefetcher(_Iterator, Generic[T]):
    """Produce the batches of ``source`` ahead of the consumer, as fresh arrays
    that nothing else can reach.

    Iterating again after the stream ended starts a new epoch when ``source``
    is re-iterable (a list, a DataLoader: ``iter(source)`` returns a new
    iterator); over a one-shot iterator it raises ``RuntimeError`` instead of
    silently yielding nothing.

    Parameters
    ----------
    source : iterable
        Any iterable of batches; ``iter(source)`` is called here, and again at
        the start of each later epoch.
    depth : int, default 4
        Batches produced ahead of the consumer (>= 1).
    workers : int, default 1
        Threads that copy; ``next(source)`` stays serialized and in order, the
        extra workers split the copying of large batches.
    device : a framework's device object, or None
        Deliver the array leaves there, through the adapter of the framework
        that owns the device's type (see ``prefetch.adapters``).
    timeout : float or None
        Longest wait for one batch in ``next()``; past it ``TimeoutError``.
    max_bytes : int or None
        Cap on the bytes of the batches waiting in the ring (copied or handed over).
    name : str or None
        Shown in ``repr``, errors and the worker thread's name.
    copy : {"auto", "always"}, default "auto"
        ``"auto"``: an array leaf that only the prefetcher can reach is handed
        over as is, without a copy: an exact ``numpy.ndarray`` that owns its
        memory (allocated by numpy, no base), is C-contiguous, aligned and
        writeable, holds no object references, has no weak reference and never
        exported a buffer, and that the source no longer references, directly
        or through the tuples, lists and dicts it sits in; so is a registered
        leaf whose adapter's ``exclusive`` hook proves the same. Typically a
        batch the source built afresh (``yield np.stack(samples)``). Every
        other array leaf is copied into pooled memory.
        ``"always"``: copy every array leaf into pooled memory.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it and the value given.
    """

    # _core and _timeout live in the compiled base (its __next__ is C); _core
    # stays None until the end of __init__, so close() works on a half-built object.

    def __init__(self, source: Iterable[T], depth: int = 4, *, workers: int = 1,
                 device: Any = None, timeout: Optional[float] = None,
                 max_bytes: Optional[int] = None, name: Optional[str] = None,
                 copy: str = "auto") -> None:
        depth = _check_int("depth", depth, 1, MAX_DEPTH)
        workers = _check_int("workers", workers, 1, MAX_WORKERS)
        self._timeout = _check_timeout(timeout)
        cap = 0 if max_bytes is None else _check_int("max_bytes", max_bytes, 1, MAX_BYTES)
        handover = _check_copy(copy)
        if name is None:
            name = f"prefetch-{next(_names)}"
        elif not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r} ({type(name).__name__})")
        try:
            iterator = iter(source)
        except TypeError:
            raise TypeError(f"source must be iterable, got {source!r} ({type(source).__name__})") from None
        # Validated once, here, by the adapter that owns the device's type.
        delivery = None if device is None else adapters._open_device(device)
        # A re-iterable source is kept for later epochs and len(); a one-shot
        # iterator is not (it would keep its last batch alive after close()).
        self._source: Optional[Iterable[T]] = None if iterator is source else source
        self._options = (depth, workers, cap, name, delivery, handover)
        # Where the user created it (past a drop-in's or a loader's own frames): where a
        # warning about it points later.
        self._created_at = _warn.user_location() or ("<unknown>", 0)
        self._start(iterator)

    def _start(self, iterator: Iterator[T]) -> None:
        core = _Core(iterator, *self._options)
        self._finalizer = weakref.finalize(self, _collected, core, self._created_at)
        global _exit_hook
        if not _exit_hook:
            # Registered after weakref.finalize's own exit hook: atexit runs
            # hooks last-in first-out, so this one runs first.
            atexit.register(_at_exit)
            _exit_hook = True
        self._core = core
        core.start()

    def __iter__(self) -> "Prefetcher[T]":
        core = self._core
        if core is not None and core.state == "ended":
            if self._source is None:
                raise RuntimeError(
                    f"{self!r} has ended and its source is a one-shot iterator; to loop "
                    "over several epochs, pass a re-iterable source (a list, a DataLoader)")
            self._finalizer.detach()
            core.close()
            self._start(iter(self._source))
        return self

    if TYPE_CHECKING:
        def __next__(self) -> T: ...

    def __reduce__(self) -> Any:
        raise TypeError(f"cannot pickle {self!r}: a Prefetcher owns threads and buffers; "
                        "pickle its source and build a new Prefetcher instead")

    def __len__(self) -> int:
        if not isinstance(self._source, Sized):
            raise TypeError(f"the source of {self!r} has no len()")
        return len(self._source)

    def close(self) -> None:
        """Stop the workers, drop unconsumed batches and free the buffers.

        Idempotent and safe from any thread. Batches the user still holds stay
        valid; their memory is freed when they are collected.
        """
        core = self._core
        if core is not None:
            core.close()

    @property
    def closed(self) -> bool:
        """True once ``close()`` has run."""
        return self._core is None or self._core.closed

    def stats(self) -> Stats:
        """A frozen snapshot of the current epoch's counters (see ``prefetch.Stats``)."""
        if self._core is None:
            raise ValueError("Prefetcher.__init__ did not complete")
        return Stats(**self._core.stats())

    def __enter__(self) -> "Prefetcher[T]":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        core = self._core
        if core is None:
            return "<Prefetcher (not constructed)>"
        return (f"<Prefetcher name={core.name!r} depth={core.depth} workers={core.workers} "
                f"fill={core.fill} state={core.state}>")
