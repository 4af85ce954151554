"""``Prefetcher``: the user-facing iterator over the compiled core (its
finalizer, ``close()`` and ``with`` are ``_Lifecycle``'s)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Generic, Iterable, Iterator, Optional, Sized, TypeVar

from prefetch import adapters
from prefetch._core import _BatchCopy, _Core, _FetchStage, _Pool
from prefetch._lifecycle import _Lifecycle
from prefetch._options import Options

T = TypeVar("T")


class Prefetcher(_Lifecycle, Generic[T]):
    """Produce the batches of ``source`` ahead of the consumer, as fresh arrays
    that nothing else can reach.

    Iterating again after the stream ended starts a new epoch over a
    re-iterable ``source``; over a one-shot iterator it raises ``RuntimeError``.

    Several threads may share one prefetcher, as a queue: each batch goes to
    one of them. ``iter()`` joins the running epoch and starts the next only
    once the stream ended; a ``next()`` still waiting then raises
    ``StopIteration``, never a batch of the next epoch. ``ClosedError`` comes
    only from ``close()``. A signal handler's ``next()`` while its thread
    waits in ``next()`` raises ``RuntimeError`` (it would wait forever).

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
        Cap on the bytes held ahead of the consumer, copied or handed over
        (docs/contract.md, "Memory").
    name : str or None
        Shown in ``repr``, errors and the worker thread's name.
    copy : {"auto", "always"}, default "auto"
        ``"auto"``: an array leaf that only the prefetcher can reach (typically
        a batch the source built afresh, ``yield np.stack(samples)``; the exact
        rules: docs/prefetcher.md, "Copies and hand-over") is handed over as
        is, every other one copied into pooled memory. A source that keeps a
        raw address into an array it yields (``a.ctypes.data``, a C reader's
        pointer) and writes there later needs ``"always"``: every array leaf
        copied.

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
        # Serialises starting an epoch with other threads' iter(); re-entrant
        # for a signal handler that calls iter() inside iter().
        self._epoch_lock = threading.RLock()
        self._options = Options.check("prefetch", name=name, depth=depth, workers=workers,
                                      max_bytes=max_bytes, timeout=timeout, copy=copy)
        self._timeout = self._options.timeout
        kind = type(source)
        if not hasattr(kind, "__iter__") and hasattr(kind, "__getitem__") and hasattr(kind, "__len__"):
            # Python would iterate it item by item through __getitem__(0, 1, ...)
            # (for ever where __getitem__ never raises IndexError): not batches.
            raise TypeError(f"source {source!r} ({kind.__name__}) has __getitem__ and __len__ but no "
                            "__iter__: a map-style dataset. To load it in batches on threads, use "
                            "prefetch.Loader(source, batch_size=...); to prefetch its items one by one, "
                            "pass iter(source)")
        try:
            iterator = iter(source)
        except TypeError:
            raise TypeError(f"source must be iterable, got {source!r} ({type(source).__name__})") from None
        # The frameworks' per-thread settings of this thread, for every epoch's publisher thread.
        self._thread_states = adapters._capture_thread_states()
        # A re-iterable source is kept for later epochs and len(); a one-shot
        # iterator is not (it would keep its last batch alive after close()).
        self._source: Optional[Iterable[T]] = None if iterator is source else source
        o = self._options
        assert o.workers is not None
        # Shared by the epochs: a new epoch reuses warm blocks and the copy threads.
        self._pool = _Pool()
        # Its device delivery (validated once, here, by the adapter that owns
        # the device's type) is the copy's, which closes it; the pool keeps
        # blocks for the batches in the ring, and two more.
        self._copy = _BatchCopy(self._pool, o.workers, o.handover,
                                None if device is None else adapters._open_device(device), o.depth + 2)
        # Closed after the epoch's core, in this order: what was copied is
        # released (the adapters' hooks, the device's among them), then the memory.
        self._owned = (self._copy, self._pool)
        self._remember_caller()
        self._start(iterator)

    def _start(self, iterator: Iterator[T]) -> None:
        stage = _FetchStage(iterator, self._copy, self._options.name)
        self._install(_Core(stage, pool=self._pool, **self._options.core()), self._thread_states)

    def __iter__(self) -> "Prefetcher[T]":
        core = self._core
        if core is None or core.state != "ended":
            return self   # the epoch runs on: this loop joins it
        with self._epoch_lock:
            if self._source is None:
                raise RuntimeError(
                    f"{self!r} has ended and its source is a one-shot iterator; to loop "
                    "over several epochs, pass a re-iterable source (a list, a DataLoader)")
            if self._core is core and core.state == "ended" and not self._closing:
                iterator = iter(self._source)
                # Checked again: a signal handler may have started an epoch
                # (or closed this one) inside iter(source).
                if self._core is core and core.state == "ended":
                    # The new core first, then the old one closed: a next()
                    # in another thread never meets a closed core in between.
                    self._start(iterator)
                    core.close()
                    if self._closing:   # close() may have read the old core: close the new one too
                        self._core.close()
        return self

    if TYPE_CHECKING:
        def __next__(self) -> T: ...

    def __len__(self) -> int:
        if not isinstance(self._source, Sized):
            raise TypeError(f"the source of {self!r} has no len()")
        return len(self._source)

    def __repr__(self) -> str:
        core = self._core
        if core is None:
            return "<Prefetcher (not constructed)>"
        return (f"<Prefetcher name={core.name!r} depth={core.depth} workers={self._copy.workers} "
                f"fill={core.fill} state={core.state}>")
