"""Resuming a ``Loader`` mid-epoch: what ``state_dict()`` records of the
epoch running, how a loaded state is checked, and how the resumed epoch skips
what was delivered before. The shuffle is a function of (seed, epoch) and
``sample_rng()`` of (seed, epoch, index), so the epoch's key lists, read again
and the delivered ones dropped, give exactly the batches that come next.
"""
from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple, Optional, Sequence

from prefetch._options import MAX_EPOCH, MAX_SEED, check_int

if TYPE_CHECKING:
    from prefetch._core import _Core, _MapEpoch
    from prefetch._streams import Workers

STATE_FORMAT = "prefetch.Loader"
STATE_VERSION = 3
# The fields, the Loader's and every drop-in's: docs/loader.md, "Resuming a run".
_STATE_KEYS = ("format", "version", "seed", "epoch", "batches", "out_of_order", "dataset_length",
               "batch_size", "order", "sampler", "streams", "framework")
_ORDER_KEYS = ("shuffle", "sampler", "batch_sampler")
STREAM_PART_KEYS = ("batches", "dataset", "iterator")


def stateful(obj: Any) -> bool:
    """The Stateful protocol: ``state_dict()`` and ``load_state_dict()``."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def order_part(shuffle: bool, sampler: Any, batch_sampler: Any) -> dict[str, Any]:
    """What decides an epoch's order besides the seed, the epoch and the
    samplers' states: shuffled or not, and the kinds (qualified class names)
    of the sampler and the batch sampler (None: the loader's own)."""
    kinds = [None if s is None else f"{type(s).__module__}.{type(s).__qualname__}" for s in (sampler, batch_sampler)]
    return {"shuffle": bool(shuffle), "sampler": kinds[0], "batch_sampler": kinds[1]}


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


class _Resume(NamedTuple):
    """Where a loaded state continues: epoch ``epoch`` without the batches
    numbered below ``prefix`` nor those in ``extras`` (delivered before the
    state was saved, out of order), the sampler's state restored first."""

    epoch: int
    prefix: int
    extras: list[int]
    sampler: Any
    streams: Any     # a stream's parts (checked: one per worker), else None
    framework: Any   # a drop-in's parts (its own to check), else None


class _Record:
    """What state_dict() reads of the epoch started last: one object,
    replaced whole when an epoch starts, so a reader on another thread sees
    one epoch's fields together. Its ``core`` and ``stage`` are set as the
    epoch starts (``Position.started``), before anything reads them."""

    __slots__ = ("epoch", "core", "stage", "skipped", "numbers", "sampler", "lock", "seen",
                 "prefix", "done", "iterator")
    core: _Core
    stage: _MapEpoch

    def __init__(self, epoch: int, skipped: Optional[_Resume], sampler: Any) -> None:
        self.epoch = epoch
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

    def taken(self) -> int:
        """The batches taken from the core: a batch whose error was raised in
        its place, the epoch going on (a drop-in's policy), was delivered too."""
        return self.core.consumed + self.core.failed

    def delivered(self, ordered: bool) -> tuple[int, list[int]]:
        """The batches delivered so far (``ordered``: in order): all those
        numbered below the first returned, and the (sorted) numbers of those past it."""
        skipped, numbers, taken = self.skipped, self.numbers, self.taken()
        if ordered and (skipped is None or not skipped.extras):
            return self.prefix + taken, []   # in order: a count
        with self.lock:
            ks: Iterable[int] = range(self.seen, taken) if ordered else self.stage.order[self.seen:taken]
            done = self.done
            done.update(ks if numbers is None else (numbers[j] for j in ks))
            self.seen = max(self.seen, taken)
            prefix = self.prefix
            while prefix in done:
                done.discard(prefix)
                prefix += 1
            self.prefix = prefix
            return prefix, sorted(done)


class StreamRecord(_Record):
    """What state_dict() reads of a stream's epoch: each worker's part as of
    its last batch delivered, and the worker due next."""

    __slots__ = ("parts", "turn")

    def __init__(self, epoch: int, parts: list[dict[str, Any]], turn: int) -> None:
        super().__init__(epoch, None, None)
        self.parts = parts
        self.turn = turn

    def streams(self) -> dict[str, Any]:
        taken = self.taken()
        with self.lock:
            for w, state in self.stage.streamed[self.seen:taken]:
                part = self.parts[w]
                dataset, iterator = (part["dataset"], part["iterator"]) if state is None else state
                self.parts[w] = {"batches": part["batches"] + 1, "dataset": dataset, "iterator": iterator}
                self.turn = (w + 1) % len(self.parts)
            self.seen = max(self.seen, taken)
            return {"next": self.turn, "workers": list(self.parts)}


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


class Identity(NamedTuple):
    """What a loader's resume state says it is, in one place: written into
    each state built here (``state``) and required of each one loaded
    (``check``). A front door checks the parts it owns itself (its
    sampler's, its framework's), after ``check``."""

    dataset: Any
    stream: bool                 # the dataset is iterable: one part per worker of its ``workers``
    batch_size: Any
    order: dict[str, Any]        # order_part's
    sampler_state: bool          # its sampler has a state of its own
    framework: Any = None        # a drop-in's part, with its "name"; None: the Loader
    workers: Optional[int] = None
    owner: str = "loader"        # what messages call the loader

    def length(self) -> Optional[int]:
        """The dataset's length now (each epoch reads it as it starts); None for a stream."""
        return None if self.stream else len(self.dataset)

    def state(self, *, seed: int, epoch: int, sampler: Any, streams: Any, prefix: int = 0,
              extras: Sequence[int] = ()) -> dict[str, Any]:
        """The one resume format, for the Loader and every drop-in: ``prefix``
        batches of ``epoch`` delivered and those numbered in ``extras`` (out of
        order) besides."""
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "seed": seed, "epoch": epoch,
                "batches": prefix + len(extras), "out_of_order": list(extras), "dataset_length": self.length(),
                "batch_size": self.batch_size, "order": copy.deepcopy(self.order), "sampler": sampler,
                "streams": streams, "framework": copy.deepcopy(self.framework)}   # the caller's own

    def check(self, state: Any, seed: Optional[int], batches_per_epoch: int) -> tuple[_Resume, int]:
        """The resume ``state`` describes, and its seed: the one check of its
        top-level fields. ValueError for one that does not fit this loader,
        its ``seed`` (None: any) and ``batches_per_epoch`` (-1: unknown). It
        changes nothing."""
        owner, framework = self.owner, None if self.framework is None else self.framework["name"]
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
        stream, saved_length, dataset_length = self.stream, state["dataset_length"], self.length()
        if stream != (saved_length is None):
            raise ValueError(f"state was saved for {_KINDS[not stream]}; this {owner}'s dataset is {_KINDS[stream]}")
        if saved_length is not None and saved_length != dataset_length:
            raise ValueError(f"state was saved for a dataset of length {saved_length!r}; this {owner}'s "
                             f"has length {dataset_length}")
        _same("batch_size", state["batch_size"], self.batch_size, owner)
        saved_order = state["order"]
        if not isinstance(saved_order, dict) or sorted(saved_order) != sorted(_ORDER_KEYS):
            raise ValueError(f"state has a bad order part (truncated or edited?): {saved_order!r:.200}")
        for key in _ORDER_KEYS:
            _same(key, saved_order[key], self.order[key], owner)
        try:
            saved_seed = check_int("seed", state["seed"], 0, MAX_SEED)
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
        if seed is not None:
            _same("seed", saved_seed, seed, owner)
        total = batches_per_epoch
        if total >= 0 and batches > total:
            raise ValueError(f"state says {batches} batches of epoch {epoch} were delivered; this "
                             f"{owner} has {total} per epoch")
        if total >= 0 and extras and extras[-1] >= total:
            raise ValueError(f"state lists batch {extras[-1]} of epoch {epoch} as delivered; this "
                             f"{owner} has {total} per epoch")
        sampler = state["sampler"]
        if sampler is not None and not self.sampler_state:
            raise ValueError(f"state holds a sampler's state, and this {owner}'s sampler has no "
                             "state_dict()/load_state_dict()")
        streams = state["streams"]
        if stream:
            # {"next": w, "workers": [part per worker]}, each part the batches its
            # worker delivered and its dataset's and iterator's own states (or None).
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
            if self.workers is not None and len(parts) != self.workers:
                raise ValueError(f"state was saved with {len(parts)} worker(s) reading the stream, each at its "
                                 f"own position; this {owner} has {self.workers}")
        elif streams is not None:
            raise ValueError(f"state holds a stream's parts, and this {owner}'s dataset is map-style (edited?)")
        return _Resume(epoch, prefix, extras, sampler, streams, saved_framework), saved_seed


_KINDS = {True: "an iterable dataset (a stream)", False: "a map-style dataset"}   # by "is a stream"


def _same(key: str, saved: Any, own: Any, owner: str) -> None:
    """ValueError where the state's ``key`` is not the loader's."""
    if saved != own:
        raise ValueError(f"state was saved with {key}={saved!r}; this {owner} has {key}={own!r}")


def _owner(framework: Optional[str]) -> str:
    return "prefetch.Loader" if framework is None else f"a {framework} drop-in"


class Position:
    """A Loader's resume state, its one owner: the epoch started last (its
    ``record``) and a loaded state the next epoch continues (``resume``),
    what the state is of in its ``identity``. Given the epoch and seed under
    the loader's epoch lock, it holds no reference to the loader, which its
    threads must not keep alive."""

    __slots__ = ("identity", "sampler", "streams", "ordered", "record", "resume")

    def __init__(self, identity: Identity, *, sampler: Any, streams: Optional[Workers], ordered: bool) -> None:
        self.identity = identity
        self.sampler = sampler if stateful(sampler) else None
        self.streams = streams
        self.ordered = ordered
        self.record: Optional[_Record] = None   # the epoch started last, with its core
        self.resume: Optional[_Resume] = None   # load_state_dict(): where the next epoch continues

    def begin(self, epoch: int) -> _Record:
        """The record of epoch ``epoch`` about to start, the loaded state's
        parts (if any) restored: the sampler's, a stream's workers'."""
        resume = self.resume
        if self.streams is not None:
            parts, turn = self.streams.begin(epoch, None if resume is None else resume.streams)
            return StreamRecord(epoch, parts, turn)
        sampler = self.sampler
        if sampler is not None and resume is not None and resume.sampler is not None:
            sampler.load_state_dict(resume.sampler)
        return _Record(epoch, resume, None if sampler is None else sampler.state_dict())

    def started(self, record: _Record, core: _Core, stage: _MapEpoch) -> None:
        """The epoch ``record`` began runs on ``core``: it is the one ``state_dict()`` reads."""
        record.core, record.stage = core, stage
        self.record, self.resume = record, None

    def set_epoch(self, epoch: int) -> None:
        """The loader's next epoch is ``epoch``: a state loaded for another is
        dropped, and an epoch left by a break is over (the state is then
        ``epoch``'s start)."""
        if self.resume is not None and self.resume.epoch != epoch:
            self.resume = None
        if self.record is not None and not self.record.iterating():
            self.record = None

    def state_dict(self, epoch: int, seed: int) -> dict[str, Any]:
        """The loader's state, its next epoch ``epoch`` and its seed ``seed``."""
        record, resume, streams = self.record, self.resume, self.streams
        extras: list[int] = []
        if resume is not None:
            epoch, prefix, extras, sampler, parts = (resume.epoch, resume.prefix, resume.extras, resume.sampler,
                                                     resume.streams)
        elif record is None or record.core.ended:
            # The next epoch's start; a sampler's state then is its own to say.
            prefix, sampler = 0, None if self.sampler is None else self.sampler.state_dict()
            parts = None if streams is None else {"next": 0, "workers": streams.starts()}
        elif isinstance(record, StreamRecord):
            epoch, sampler, parts = record.epoch, None, record.streams()
        else:
            epoch, sampler, parts = record.epoch, record.sampler, None
            prefix, extras = record.delivered(self.ordered)
        if parts is not None:   # a stream: the batches its workers delivered
            prefix = sum(p["batches"] for p in parts["workers"])
        return self.identity.state(seed=seed, epoch=epoch, prefix=prefix, extras=extras, sampler=sampler,
                                   streams=copy.deepcopy(parts))
