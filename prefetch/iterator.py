"""``Prefetcher``: the user-facing iterator over the compiled core.

This layer owns what users touch: argument checks, ``repr``, the context
manager and the finalizer. The fetch thread references only the inner
``_Core``, so dropping the last reference to a ``Prefetcher`` runs its
finalizer at once, which closes the core and joins the thread (SPEC §5).
"""
from __future__ import annotations

import itertools
import math
import numbers
import weakref
from typing import Any, Iterable, Optional, Sized

from prefetch import adapters
from prefetch._core import _Core, _Iterator
from prefetch._types import Stats

_names = itertools.count(1)


# Upper bounds: a ring slot per depth, a thread per worker; past these a
# value is a mistake, not a configuration.
MAX_DEPTH = 1 << 20
MAX_WORKERS = 256
MAX_BYTES = (1 << 63) - 1


def _check_int(arg: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{arg} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    number = int(value)
    if not minimum <= number <= maximum:
        raise ValueError(f"{arg} must be an int >= {minimum} and <= {maximum}, got {value!r}")
    return number


def _check_timeout(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {value!r} ({type(value).__name__})")
    seconds = float(value)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {value!r}")
    return seconds


class Prefetcher(_Iterator):
    """Produce the batches of ``source`` ahead of the consumer, as fresh copies.

    Parameters
    ----------
    source : iterable
        Any iterable of batches; ``iter(source)`` is called once, here.
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
        Cap on the bytes of the batches waiting in the ring.
    name : str or None
        Shown in ``repr``, errors and the worker thread's name.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it and the value given.
    """

    # _core and _timeout live in the compiled base (its __next__ is C); _core
    # stays None until the end of __init__, so close() works on a half-built object.

    def __init__(self, source: Iterable[Any], depth: int = 4, *, workers: int = 1,
                 device: Any = None, timeout: Optional[float] = None,
                 max_bytes: Optional[int] = None, name: Optional[str] = None) -> None:
        depth = _check_int("depth", depth, 1, MAX_DEPTH)
        workers = _check_int("workers", workers, 1, MAX_WORKERS)
        self._timeout = _check_timeout(timeout)
        cap = 0 if max_bytes is None else _check_int("max_bytes", max_bytes, 1, MAX_BYTES)
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
        # Kept only to answer len(): holding a generator would keep its last
        # batch alive after close().
        self._sized_source: Optional[Sized] = source if isinstance(source, Sized) else None
        core = _Core(iterator, depth, workers, cap, name, delivery)
        self._finalizer = weakref.finalize(self, core.close)
        self._core = core
        core.start()

    def __len__(self) -> int:
        if self._sized_source is None:
            raise TypeError(f"the source of {self!r} has no len()")
        return len(self._sized_source)

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
        """A frozen snapshot of the counters (see ``prefetch.Stats``)."""
        if self._core is None:
            raise ValueError("Prefetcher.__init__ did not complete")
        return Stats(**self._core.stats())

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        core = self._core
        if core is None:
            return "<Prefetcher (not constructed)>"
        return (f"<Prefetcher name={core.name!r} depth={core.depth} workers={core.workers} "
                f"fill={core.fill} state={core.state}>")
