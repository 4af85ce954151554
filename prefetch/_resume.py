"""Resuming a ``Loader`` mid-epoch: what ``state_dict()`` records of the
epoch running, how a loaded state is checked, and how the resumed epoch skips
what was delivered before. The shuffle is a function of (seed, epoch) and
``sample_rng()`` of (seed, epoch, index), so the epoch's key lists, read again
and the delivered ones dropped, give exactly the batches that come next.
"""
from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

from prefetch._options import MAX_EPOCH, MAX_SEED, check_int
from prefetch._types import ClosedError

if TYPE_CHECKING:
    from prefetch._core import _Core, _MapEpoch

STATE_FORMAT = "prefetch.Loader"
STATE_VERSION = 3
# "batches": the batches of "epoch" delivered (in every part that counts them).
# "batch_size": the samples per batch the user asked for (None: each sample its own).
# "order": what decides the epoch's order besides the seed, the epoch and the
# sampler's own state (order_part). "sampler": the sampler's own state, or the
# drop-in's sampler side (the generators its order is drawn from).
# "streams": None for a map-style dataset; for an iterable dataset (a
# stream), each worker's part and the worker whose batch is due next.
# "framework": None for the Loader; a drop-in's parts, under its framework's name.
_STATE_KEYS = ("format", "version", "seed", "epoch", "batches", "out_of_order", "dataset_length",
               "batch_size", "order", "sampler", "streams", "framework")
_ORDER_KEYS = ("shuffle", "sampler", "batch_sampler")


def stateful(obj: Any) -> bool:
    """The Stateful protocol: ``state_dict()`` and ``load_state_dict()``."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def order_part(shuffle: bool, sampler: Any, batch_sampler: Any) -> dict[str, Any]:
    """What decides an epoch's order besides the seed, the epoch and the
    samplers' states: shuffled or not, and the kinds (qualified class names)
    of the sampler and the batch sampler (None: the loader's own)."""
    return {"shuffle": bool(shuffle), "sampler": _kind_name(sampler), "batch_sampler": _kind_name(batch_sampler)}


def _kind_name(obj: Any) -> Optional[str]:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def make_state(*, seed: int, epoch: int, prefix: int, extras: list[int], dataset_length: Optional[int],
               batch_size: Any, order: dict[str, Any], sampler: Any, streams: Any,
               framework: Any) -> dict[str, Any]:
    """The one resume format, for the Loader and every drop-in: ``prefix``
    batches of ``epoch`` delivered and those numbered in ``extras`` (out of
    order) besides; ``dataset_length`` None for a stream."""
    return {"format": STATE_FORMAT, "version": STATE_VERSION, "seed": seed, "epoch": epoch,
            "batches": prefix + len(extras), "out_of_order": list(extras), "dataset_length": dataset_length,
            "batch_size": batch_size, "order": order, "sampler": sampler, "streams": streams,
            "framework": framework}


def try_state(holder: Any, saved: Any) -> None:
    """ValueError where ``holder`` (a sampler) refuses ``saved`` in its
    ``load_state_dict``. The holder's own state is put back either way: a
    check changes nothing, and the epoch the state resumes loads it."""
    own = copy.deepcopy(holder.state_dict())   # not a view of what the load below changes
    try:
        holder.load_state_dict(copy.deepcopy(saved))
    except Exception as exc:
        raise ValueError(f"{type(holder).__name__}.load_state_dict refused its state: {exc!r}") from None
    finally:
        holder.load_state_dict(own)


class _Resume:
    """Where a loaded state continues: epoch ``epoch`` without the batches
    numbered below ``prefix`` nor those in ``extras`` (delivered before the
    state was saved, out of order), the sampler's state restored first."""

    __slots__ = ("epoch", "prefix", "extras", "sampler", "streams", "framework")

    def __init__(self, epoch: int, prefix: int, extras: list[int], sampler: Any, streams: Any,
                 framework: Any) -> None:
        self.epoch = epoch
        self.prefix = prefix
        self.extras = extras
        self.sampler = sampler
        self.streams = streams        # a stream's parts (checked: one per worker), else None
        self.framework = framework    # a drop-in's parts (its own to check), else None


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
        # A batch whose error was raised in its place, the epoch going on
        # (a drop-in's policy), was delivered too.
        taken = 0 if core is None else core.consumed + core.failed
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


def check_state(state: Any, *, dataset_length: Optional[int], batch_size: Any, order: dict[str, Any],
                seed: Optional[int], batches_per_epoch: int, sampler_has_state: bool,
                framework: Optional[str] = None, workers: Optional[int] = None,
                owner: str = "loader") -> tuple[_Resume, int]:
    """The resume ``state`` (from ``state_dict()``) describes, and its seed:
    the one check of its top-level fields, where it is loaded (the sampler's
    and the framework's parts are their owners' to check). ValueError for one
    that does not fit a loader over a dataset of ``dataset_length`` (None: a
    stream, whose state has one part per worker of its ``workers``) with
    ``batch_size``, ``order`` (``order_part``), its own ``seed`` (None: any),
    ``batches_per_epoch`` (-1: unknown), and whose state's framework part is
    ``framework``'s (None: the Loader's own, which has none). Messages call
    the loader ``owner``. It changes nothing."""
    fixed_seed = seed

    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"state is not a prefetch loader's state (its format is {state.get('format')!r}, "
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
    saved_framework = state["framework"]
    saved_name = saved_framework.get("name") if isinstance(saved_framework, dict) else saved_framework
    if saved_name != framework:
        raise ValueError(f"state was saved by {_owner(saved_name)}; this is {_owner(framework)}")
    stream, saved_stream = dataset_length is None, state["dataset_length"] is None
    if stream != saved_stream:
        raise ValueError(f"state was saved for {_kind(saved_stream)}; this {owner}'s dataset is {_kind(stream)}")
    saved_length, saved_batch_size = state["dataset_length"], state["batch_size"]
    if saved_length is not None and saved_length != dataset_length:
        raise ValueError(f"state was saved for a dataset of length {saved_length!r}; this {owner}'s "
                         f"has length {dataset_length}")
    if saved_batch_size != batch_size:
        raise ValueError(f"state was saved with batch_size={saved_batch_size!r}; this {owner} has "
                         f"batch_size={batch_size!r}")
    _check_order(state["order"], order, owner)
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
        raise ValueError(f"state was saved with seed={seed}; this {owner} has seed={fixed_seed}")
    total = batches_per_epoch
    if total >= 0 and batches > total:
        raise ValueError(f"state says {batches} batches of epoch {epoch} were delivered; this "
                         f"{owner} has {total} per epoch")
    if total >= 0 and extras and extras[-1] >= total:
        raise ValueError(f"state lists batch {extras[-1]} of epoch {epoch} as delivered; this "
                         f"{owner} has {total} per epoch")
    sampler = state["sampler"]
    if sampler is not None and not sampler_has_state:
        raise ValueError(f"state holds a sampler's state, and this {owner}'s sampler has no "
                         "state_dict()/load_state_dict()")
    streams = state["streams"]
    if stream:
        _check_streams(streams, workers, owner)
    elif streams is not None:
        raise ValueError(f"state holds a stream's parts, and this {owner}'s dataset is map-style (edited?)")
    return _Resume(epoch, prefix, extras, sampler, streams, saved_framework), seed


def _check_order(saved: Any, order: dict[str, Any], owner: str) -> None:
    if not isinstance(saved, dict) or sorted(saved) != sorted(_ORDER_KEYS):
        raise ValueError(f"state has a bad order part (truncated or edited?): {saved!r:.200}")
    for key in _ORDER_KEYS:
        if saved[key] != order[key]:
            raise ValueError(f"state was saved with {key}={saved[key]!r}; this {owner} has {key}={order[key]!r}")


def _owner(framework: Optional[str]) -> str:
    return "prefetch.Loader" if framework is None else f"a {framework} drop-in"


def _kind(stream: bool) -> str:
    return "an iterable dataset (a stream)" if stream else "a map-style dataset"


STREAM_PART_KEYS = ("batches", "dataset", "iterator")


def _check_streams(streams: Any, workers: Optional[int], owner: str) -> None:
    """A stream's parts: ``{"next": w, "workers": [part per worker]}``, each
    part the batches its worker delivered and its dataset's and iterator's
    own states (or None)."""
    try:
        parts, due = streams["workers"], streams["next"]
        if not isinstance(parts, list) or not parts:
            raise TypeError("workers must be a non-empty list")
        check_int("next", due, 0, len(parts) - 1)
        for part in parts:
            if not isinstance(part, dict) or sorted(part) != sorted(STREAM_PART_KEYS):
                raise TypeError(f"a worker's part must have the keys {STREAM_PART_KEYS}, got {part!r:.100}")
            check_int("batches", part["batches"], 0, MAX_EPOCH)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"state has bad stream parts (truncated or edited?): {exc}") from None
    if workers is not None and len(parts) != workers:
        raise ValueError(f"state was saved with {len(parts)} worker(s) reading the stream, each at its "
                         f"own position; this {owner} has {workers}")


class _LoaderState:
    """The Loader's resume state: ``state_dict()`` and ``load_state_dict()``
    over the records above (a mixin of prefetch.loader.Loader, whose fields
    it reads: the epoch started last, a loaded state, the sampler, a
    stream's workers)."""

    _epoch_lock: Any
    _record: Optional[_Record]
    _resume: Optional[_Resume]
    _epoch: int
    _seed: int
    _closing: bool
    _name: Any
    _stage: Any
    _core: Optional[_Core]
    _options: Any
    _streams: Any
    dataset: Any
    batch_size: Optional[int]
    shuffle: bool
    sampler: Any
    batch_sampler: Any

    if TYPE_CHECKING:
        def __len__(self) -> int: ...

    def _sampler_with_state(self) -> Any:
        sampler = self.batch_sampler if self.batch_sampler is not None else self.sampler
        return sampler if stateful(sampler) else None

    def _begin(self, epoch: int, resume: Optional[_Resume]) -> _Record:
        sampler = self._sampler_with_state()
        if resume is not None and resume.sampler is not None:
            sampler.load_state_dict(resume.sampler)
        saved = None if sampler is None else sampler.state_dict()
        return _Record(epoch, resume, saved, self._options.ordered)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: a small JSON-serialisable dict (format and
        version, seed, epoch, the batches of that epoch delivered so far, the
        dataset's length, the batch size, the sampler's own ``state_dict()``
        at the epoch's start where it has one; for an iterable dataset, each
        worker's part instead of a length). Taken at any moment, from any
        thread, without pausing the loader threads; batches loaded ahead and
        not yet delivered are not counted. Once an epoch has ended, the state
        is the next epoch's start."""
        with self._epoch_lock:
            record, resume, epoch = self._record, self._resume, self._epoch
        streams = self._streams
        extras: list[int] = []
        if resume is not None:
            epoch, prefix, extras, sampler, parts = (resume.epoch, resume.prefix, resume.extras, resume.sampler,
                                                     resume.streams)
        elif record is None or record.core is None or record.core.ended:
            # The next epoch's start; a sampler's state then is its own to say.
            prefix, holder = 0, self._sampler_with_state()
            sampler = None if holder is None else holder.state_dict()
            parts = None if streams is None else {"next": 0, "workers": streams.starts()}
        elif streams is not None:
            epoch, sampler, parts = record.epoch, None, record.streams()  # type: ignore[attr-defined]
        else:
            epoch, sampler, parts = record.epoch, record.sampler, None
            prefix, extras = record.delivered()
        if parts is not None:   # a stream: the batches its workers delivered
            prefix = sum(p["batches"] for p in parts["workers"])
        return make_state(seed=self._seed, epoch=epoch, prefix=prefix, extras=extras,
                          dataset_length=None if streams is not None else len(self.dataset),
                          batch_size=self.batch_size, order=self._order_part(), sampler=sampler,
                          streams=copy.deepcopy(parts), framework=self._framework_part())

    def _framework_part(self) -> Any:
        """A drop-in's parts of the state (its framework's name under "name"); None: the Loader's."""
        return None

    def _order_part(self) -> dict[str, Any]:
        """What decides its epochs' order (``order_part``)."""
        return order_part(self.shuffle, self.sampler, self.batch_sampler)

    def _framework_name(self) -> Optional[str]:
        part = self._framework_part()
        return None if part is None else part["name"]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` (from ``state_dict()``, of a loader over the
        same data, batch size and sampler) was taken: the next
        ``iter(loader)`` delivers the batches an uninterrupted run would have
        delivered next. Call it before iterating, between epochs, or after a
        ``break`` out of an epoch's loop (that epoch then ends).

        Raises
        ------
        ValueError
            For a state of another format or version, dataset kind or length,
            batch size, seed, order (shuffled or not, the sampler's kind) or
            count of workers reading a stream, one its sampler refuses, or
            one truncated or edited; the loader is unchanged.
        ClosedError
            Once the loader is closed.
        RuntimeError
            While an epoch is in progress (its iterator is still held).
        """
        if self._closing:
            raise ClosedError(f"loader {self._name!r} is closed: cannot load a state into it")
        resume, seed = self._check_state(state)
        holder = self._sampler_with_state()
        if holder is not None and resume.sampler is not None:
            try_state(holder, resume.sampler)   # the sampler's part: its own to check
        self._load_checked(resume, seed)

    def _load_checked(self, resume: _Resume, seed: int) -> None:
        """Continue where a state checked by ``check_state`` was taken."""
        with self._epoch_lock:
            if self._closing:
                raise ClosedError(f"loader {self._name!r} is closed: cannot load a state into it")
            record = self._record
            if record is not None and record.core is not None and record.core.state == "running":
                if record.iterating():
                    raise RuntimeError(
                        f"cannot load a state into {self!r} while its epoch {record.epoch} is in progress; "
                        "load it before iterating, once the epoch has ended, or after a break out of its loop")
                # Its iterator is gone (a break): the epoch ends here, and
                # next(loader) starts the one the state continues.
                record.core.close()
                self._core = None
            self._stage.drop_following()   # the next epoch is the state's
            if seed != self._seed:
                self._seed = seed
                self._stage.seed = seed
            self._epoch = resume.epoch
            self._resume = resume

    def _check_state(self, state: Any) -> tuple[_Resume, int]:
        streams = self._streams
        try:
            total = len(self)
        except TypeError:
            total = -1   # a stream, or a sampler without len(): nothing to check against
        return check_state(state, dataset_length=None if streams is not None else len(self.dataset),
                           batch_size=self.batch_size, order=self._order_part(),
                           seed=self._seed if self._options.seed is not None else None, batches_per_epoch=total,
                           sampler_has_state=self._sampler_with_state() is not None,
                           framework=self._framework_name(), workers=None if streams is None else streams.count)
