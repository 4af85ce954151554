"""The one seam a framework's drop-in (an adapter folder of the package)
stands on: everything a drop-in may use of the core is exported here
(``__all__``; the compiled parts its Cython cimports, in ``_framework.pxd``),
and it imports nothing else of the core (tests/core/test_framework_seam.py).
A drop-in translates its framework's arguments and supplies the framework's
sampler and worker idioms and its state's framework parts; it reads no
private attribute of the Loader's objects, only what is declared here or on
the epoch iterator (``failed_batches``, ``running``, ``stop()``). A map-style one gives the
Loader the epoch's index lists as its ``batch_sampler``, each index passed to
``dataset[...]`` as the framework passes it (the dataset raises for a bad one).
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Optional

from prefetch import _lifecycle, _warn
from prefetch._core import MAP_KEYS_UNCHECKED
from prefetch._handover import Choice, Cut, ProcessEpoch, say_handover, start_method, unpicklable
from prefetch._lifecycle import Closing
from prefetch._options import (
    MAX_EPOCH,
    Options,
    check_batch_size,
    check_dataset,
    check_int,
    check_loading,
    check_num_workers,
)
from prefetch._replica import for_processes, replica
from prefetch._resume import Identity, order_part, stateful, try_state
from prefetch._streams import start_part, stream_copy
from prefetch._types import ClosedError, GILBoundWarning, Stats
from prefetch._warn import machinery
from prefetch._warn import warn as warn_at_user
from prefetch.adapters import (
    register_collate,
    register_container,
    register_device,
    register_leaf,
    register_thread_state,
)
from prefetch.iterator import Prefetcher
from prefetch.loader import Loader, ints, worker_info

__all__ = ["MAX_EPOCH", "Choice", "ClosedError", "Closing", "Cut", "FrameworkLoader", "GILBoundWarning",
           "Identity", "Options", "Prefetcher", "Stats", "check_batch_size", "check_dataset", "check_int",
           "check_loading", "check_num_workers", "close_when_dropped", "for_processes", "ints", "machinery",
           "order_part", "ProcessEpoch", "register_collate", "register_container", "register_device", "register_leaf",
           "register_thread_state", "replica", "say_handover", "start_part", "start_method", "stateful",
           "stream_copy", "try_state", "unpicklable", "warn_at_user", "worker_info"]


class FrameworkLoader(Loader):  # type: ignore[type-arg]
    """A Loader over a drop-in's batch sampler.

    ``remedy``: the framework's process loader, named in the GIL warning.
    ``per_thread``: (dataset, worker_id) -> that thread's own dataset (as each
    worker process holds; for a stream, the copy its worker iterates).
    ``lookahead``: at most that many batches opened and not yet taken (0:
    the Loader's own bounds only). ``go_on``: a batch whose sample or
    collate raised is that batch's error and the epoch goes on.
    ``gil_noticed``: the GIL warning was given already, not again.
    ``on_notice``: gets the ``GILBoundWarning``, on the consumer's thread,
    instead of its being raised. ``identity``: what its resume state is of,
    the drop-in's (its framework part, order and batch size; its
    ``stream``: the dataset is iterable, whatever else it has)."""

    def __init__(self, dataset: Any, *, remedy: str, identity: Optional[Identity] = None,
                 per_thread: Optional[Callable[[Any, int], Any]] = None,
                 lookahead: int = 0, go_on: bool = False, gil_noticed: bool = False,
                 on_notice: Optional[Callable[[Warning], None]] = None, **kwargs: Any) -> None:
        self._stream = stream = identity is not None and identity.stream
        self._replicate = per_thread if stream else None
        self._hooks = dict(remedy=f"{remedy} (processes), wrapped in prefetch.Prefetcher to keep the same "
                                  "batch guarantees", lookahead=lookahead, go_on=go_on, gil_noticed=gil_noticed,
                           on_notice=on_notice,
                           # each thread's dataset; a partial: the threads keep no loader alive
                           per_thread=None if per_thread is None or stream else functools.partial(per_thread, dataset))
        self._identity = identity
        super().__init__(dataset, **kwargs)

    # A state the drop-in's load_state_dict checked (Identity.check, its parts by their owners): not again.
    load_checked = Loader._load_checked

    @property
    def gil_noticed(self) -> bool:
        """The GIL warning was given (or was already, by ``gil_noticed=``)."""
        return bool(self._stage.gil_noticed)

    def _keys(self, epoch: int) -> tuple[Any, int, int]:
        batches, n_keys, rows = super()._keys(epoch)
        return batches, n_keys if self._stream else MAP_KEYS_UNCHECKED, rows

    def _order(self, epoch: int) -> Any:
        order = getattr(self.batch_sampler, "order", None)
        return None if order is None else order(epoch)


def close_when_dropped(owner: Any, close: Callable[[], None]) -> None:
    """``close()`` once ``owner`` (a framework's iterator, which has no
    close() of its own) is collected, on a daemon thread of its own (at
    interpreter exit, at once): the line that dropped it does not wait for a
    thread still inside the dataset, and a warning about one points at the
    user's line that made ``owner`` (past the framework's frames named by
    ``machinery``)."""
    at = _warn.user_location()

    def closing() -> None:
        with _warn.pointing_at(at):
            close()

    def aside() -> None:
        if not _lifecycle._exiting:
            try:
                threading.Thread(target=closing, name="prefetch-close", daemon=True).start()
                return
            except RuntimeError:   # no new thread now (the interpreter is shutting down)
                pass
        closing()

    weakref.finalize(owner, aside)
