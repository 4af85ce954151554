"""Resuming a ``Loader`` mid-epoch: what ``state_dict()`` records of the
epoch running, how a loaded state is checked, and how the resumed epoch skips
what was delivered before. The shuffle is a function of (seed, epoch) and
``sample_rng()`` of (seed, epoch, index), so the epoch's key lists, read again
and the delivered ones dropped, give exactly the batches that come next.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

from prefetch._options import MAX_EPOCH, MAX_SEED, check_int

if TYPE_CHECKING:
    from prefetch._core import _Core, _MapEpoch

STATE_FORMAT = "prefetch.Loader"
STATE_VERSION = 1
_STATE_KEYS = ("format", "version", "seed", "epoch", "batches", "out_of_order", "dataset_length",
               "batch_size", "sampler")


class _Resume:
    """Where a loaded state continues: epoch ``epoch`` without the batches
    numbered below ``prefix`` nor those in ``extras`` (delivered before the
    state was saved, out of order), the sampler's state restored first."""

    __slots__ = ("epoch", "prefix", "extras", "sampler")

    def __init__(self, epoch: int, prefix: int, extras: list[int], sampler: Any) -> None:
        self.epoch = epoch
        self.prefix = prefix
        self.extras = extras
        self.sampler = sampler


class _Record:
    """What state_dict() reads of the epoch started last: one object,
    replaced whole when an epoch starts, so a reader on another thread sees
    one epoch's fields together."""

    __slots__ = ("epoch", "core", "stage", "ordered", "skipped", "numbers", "sampler", "lock", "seen",
                 "prefix", "done", "iterator")

    def __init__(self, epoch: int, skipped: Optional[_Resume], sampler: Any, ordered: bool) -> None:
        self.epoch = epoch
        self.core: Optional[_Core] = None
        self.stage: Optional[_MapEpoch] = None
        self.ordered = ordered
        self.skipped = skipped               # the resume this epoch continues, if any
        # With a resume: the number in the whole epoch of each key list the stage read.
        self.numbers: Optional[list[int]] = None if skipped is None else []
        self.sampler = sampler               # the sampler's state_dict() at the epoch's start
        # Out of order: the batches delivered, counted on from the last call
        # (so a call costs the batches delivered since, not the epoch's).
        self.lock = threading.Lock()
        self.seen = 0                        # the core's batches counted
        self.prefix = 0 if skipped is None else skipped.prefix   # every batch below it delivered
        self.done = set() if skipped is None else set(skipped.extras)   # delivered, past the prefix
        # A weak reference to the epoch's iterator (None: next() on the loader itself).
        self.iterator: Optional[Callable[[], Any]] = None

    def iterating(self) -> bool:
        """The epoch may still be taken from: its iterator is alive, or it is
        the loader's own next()."""
        return self.iterator is None or self.iterator() is not None

    def delivered(self) -> tuple[int, list[int]]:
        """The batches delivered so far: all those numbered below the first
        returned, and the (sorted) numbers of those past it."""
        core, stage, skipped, numbers = self.core, self.stage, self.skipped, self.numbers
        taken = 0 if core is None else core.consumed
        if (self.ordered or stage is None) and (skipped is None or not skipped.extras):
            return self.prefix + taken, []   # in order: a count
        with self.lock:
            ks: Iterable[int] = (range(self.seen, taken) if self.ordered or stage is None
                                 else stage.order[self.seen:taken])
            done = self.done
            done.update(ks if numbers is None else (numbers[j] for j in ks))
            self.seen = max(self.seen, taken)
            prefix = self.prefix
            while prefix in done:
                done.discard(prefix)
                prefix += 1
            self.prefix = prefix
            return prefix, sorted(done)


def _skipping(batches: Iterator[list[Any]], resume: _Resume, numbers: list[int]) -> Iterator[list[Any]]:
    """The epoch's key lists without those delivered before its state was
    saved (read and dropped: the order is the sampler's to give again);
    ``numbers`` gets the number of each one yielded. Read by one thread at a
    time (the stage's lock)."""
    skip = set(resume.extras)
    for k, keys in enumerate(batches):
        if k < resume.prefix or k in skip:
            continue
        numbers.append(k)
        yield keys


def check_state(state: Any, *, dataset_length: int, batch_size: Optional[int], seed: Optional[int],
                batches_per_epoch: int, sampler_has_state: bool) -> tuple[_Resume, int]:
    """The resume ``state`` (from ``Loader.state_dict()``) describes, and its
    seed; ValueError for one that does not fit a loader over a dataset of
    ``dataset_length`` with ``batch_size``, its own ``seed`` (None: any) and
    ``batches_per_epoch`` (-1: unknown)."""
    fixed_seed = seed

    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"state is not a Loader state (its format is {state.get('format')!r}, "
                         f"expected {STATE_FORMAT!r})")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"state has format version {state.get('version')!r}; this version of "
                         f"prefetch reads version {STATE_VERSION}")
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise ValueError(f"state lacks {', '.join(map(repr, missing))} (truncated or edited?)")
    unknown = sorted(set(state) - set(_STATE_KEYS))
    if unknown:
        raise ValueError(f"state has unknown keys {', '.join(map(repr, unknown))} (edited?)")
    n = dataset_length
    if state["dataset_length"] != n:
        raise ValueError(f"state was saved for a dataset of length {state['dataset_length']!r}; "
                         f"this loader's has length {n}")
    if state["batch_size"] != batch_size:
        raise ValueError(f"state was saved with batch_size={state['batch_size']!r}; this loader "
                         f"has batch_size={batch_size!r}")
    try:
        seed = check_int("seed", state["seed"], 0, MAX_SEED)
        epoch = check_int("epoch", state["epoch"], 0, MAX_EPOCH)
        batches = check_int("batches", state["batches"], 0, MAX_EPOCH)
        extras = state["out_of_order"]
        if not isinstance(extras, list):
            raise TypeError(f"out_of_order must be a list of batch numbers, got {extras!r}")
        extras = [check_int("out_of_order", k, 0, MAX_EPOCH) for k in extras]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"state has a bad value (edited?): {exc}") from None
    prefix = batches - len(extras)
    if prefix < 0 or extras != sorted(set(extras)) or (extras and extras[0] <= prefix):
        raise ValueError(f"state has batches={batches} and out_of_order={extras!r}, which do not "
                         "fit together (edited?)")
    if fixed_seed is not None and seed != fixed_seed:
        raise ValueError(f"state was saved with seed={seed}; this loader has seed={fixed_seed}")
    total = batches_per_epoch
    if total >= 0 and batches > total:
        raise ValueError(f"state says {batches} batches of epoch {epoch} were delivered; this "
                         f"loader has {total} per epoch")
    sampler = state["sampler"]
    if sampler is not None and not sampler_has_state:
        raise ValueError("state holds a sampler's state, and this loader's sampler has no "
                         "state_dict()/load_state_dict()")
    return _Resume(epoch, prefix, extras, sampler), seed
