"""What the drop-ins' hand-over to their framework's own worker processes
shares, framework-free (each drop-in drives its framework's own worker
machinery). Threading contract: ``Cut.__next__`` runs on the Loader's
threads; everything else on the consumer's thread.
"""
from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterator, Optional

from prefetch._types import GILBoundWarning, Stats
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


class Choice:
    """Where one DataLoader's epochs load (its ``loading=``): in its
    framework's worker processes (``processes``), or on threads; with
    ``"auto"``, on threads until the GIL notice is acted on (``decide``)."""

    __slots__ = ("processes", "decided", "notices")

    def __init__(self, loading: str) -> None:
        self.processes = loading == "processes"
        self.decided = loading != "auto"
        # The GIL notices the Loaders passed (on_notice: the list's append, so a
        # Loader holds no reference to the DataLoader, which its threads go with).
        self.notices: list[Any] = []

    def on_notice(self, can_hand_over: bool) -> Optional[Callable[[Any], None]]:
        """A Loader's ``on_notice``: None (the core warns itself) once decided,
        or where there is nothing to hand over (``can_hand_over`` False)."""
        return self.notices.append if can_hand_over and not self.decided else None

    def decide(self, why_not: Callable[[], Optional[str]], say: Callable[[Any, Optional[str]], None]) -> bool:
        """The notice taken and acted on once per DataLoader, whichever of its
        Loaders noticed: ``why_not()`` the processes cannot take the epochs
        (None: they can), ``say(note, reason)`` the one warning. True where
        the epochs now load in processes."""
        note = self.notices.pop()
        self.notices.clear()
        if self.decided:
            return False
        self.decided = True
        reason = why_not()
        say(note, reason)
        self.processes = reason is None
        return self.processes


class Cut:
    """An epoch's index lists as the Loader's threads take them (their batch
    sampler's iterator), until cut (``rest()``): what is left is the worker
    processes' to load."""

    def __init__(self, keys: Iterator[Any], done: bool, skip: int) -> None:
        self.keys = keys
        self.lock = threading.Lock()   # a thread takes, or the consumer cuts
        self.done = done               # an epoch begun in processes: the threads take none
        self.skip = skip               # batches handed out before a resumed state was saved
        self.taken = 0

    def __iter__(self) -> Cut:
        return self

    def __next__(self) -> Any:
        with self.lock:
            if self.done:
                raise StopIteration
            keys = next(self.keys)
            self.taken += 1
            return keys

    def rest(self) -> Iterator[Any]:
        """The index lists no thread took (the threads take no more), past
        those handed out before a resumed state was saved (the Loader's
        threads read and drop them: those they did not take are dropped here)."""
        with self.lock:
            self.done = True
            return itertools.islice(self.keys, max(0, self.skip - self.taken), None)


class ProcessEpoch:
    """An epoch that the worker processes finish, as the DataLoader's state
    and stats read it: the thread Loader's record of the epoch (as it was
    cut) with the batches handed out counted here."""

    def __init__(self, source: Any, handed: int) -> None:
        self.source = source
        self.state = source.state_dict()   # taken while the epoch runs: this epoch's
        self.handed = handed               # batches of the epoch handed out (or failed)
        self.finished = False

    def state_dict(self) -> dict[str, Any]:
        if self.finished:
            return self.source.state_dict()  # type: ignore[no-any-return]  # the next epoch's start
        return dict(self.state, batches=self.handed, out_of_order=[])

    def stats(self) -> Stats:
        stats: Stats = self.source.stats()
        return dataclasses.replace(stats, consumed=self.handed, loading="processes")
