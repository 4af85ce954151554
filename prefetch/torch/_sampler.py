"""torch's sampler as the Loader's batch sampler (``_Batches``: read on the
consumer's thread where torch's main process reads it, so a sampler that
draws from a generator draws when it would under torch, whatever the
threads' timing), and the orders known ahead.

Where the sampler is one of torch's own whose order can be read before the
epoch (``SequentialSampler``; ``RandomSampler`` over a CPU generator of its
own), the epoch's order is a *plan* (``_Plan``): the Loader's threads take
the batches from a replay of torch's own classes over ``range(n)`` and a
copy of the generator, so they are the batches torch's sampler gives, and
open the next epoch's first batches while this one's last are consumed. The
real sampler is still read (for its draws); the next epoch's early batches
are kept only when its plan, read again as it begins, is the one they were
opened for (no one drew from the generator in between).

torch's ``RandomSampler`` (without replacement) makes a list of every index
for each permutation (1.5 M indices: about 58 MiB of int objects, held
while the epoch lasts, and another for the plan): ``_Permutation`` keeps
the permutation a tensor (8 bytes an index) instead.
"""
from __future__ import annotations

import base64
import collections
import contextlib
import copy
import itertools
import threading
from typing import Any, NamedTuple, Optional

from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from prefetch._framework import Cut, ints, stateful
from prefetch.torch._torch import torch


class _Plan(NamedTuple):
    """What an epoch's order is a function of (compared whole: equal plans, equal batches)."""
    epoch: int                 # the Loader's epoch (prefetch.sample_rng() draws by it)
    n: int                     # len(dataset) when it was read
    batch_size: Optional[int]  # None: each index a batch of its own
    drop_last: bool
    shuffle: bool
    replacement: bool
    num_samples: Optional[int]
    state: str                 # the generator's state as the epoch begins, encode_generator's text ("": none)

    def sampler(self) -> Any:
        if not self.shuffle:
            return SequentialSampler(range(self.n))
        return RandomSampler(range(self.n), replacement=self.replacement, num_samples=self.num_samples,
                             generator=decode_generator(self.state))

    def batches(self) -> Any:
        """The epoch's index lists, as torch's sampler gives them."""
        sampler = _lean(self.sampler())
        if self.batch_size is None:
            return ([i] for i in sampler)
        return iter(BatchSampler(sampler, self.batch_size, self.drop_last))

    def following(self) -> _Plan:
        """The next epoch's plan, once this one's sampler is read to its end.
        Without replacement only the draws are made (the permutations, not
        their lists: torch's sampler makes ``num_samples // n + 1``); a wrong
        state here would only make the plan miss, never give other batches."""
        if not self.shuffle:
            return self._replace(epoch=self.epoch + 1)
        sampler = self.sampler()
        g = sampler.generator
        if self.replacement:
            for _ in sampler:
                pass
        else:
            for _ in range(sampler.num_samples // self.n + 1):
                torch.randperm(self.n, generator=g)
        return self._replace(epoch=self.epoch + 1, state=encode_generator(g))


class _Early(NamedTuple):
    """The next epoch's plan as the Loader opens its first batches early:
    the Loader's token for that epoch (``order``), whose key lists are a
    ``Cut`` of their own (what the threads took of them is known)."""
    plan: _Plan
    cut: Cut

    def batches(self) -> Cut:
        return self.cut


def _plan(index_sampler: Any, single: bool, epoch: int) -> Optional[_Plan]:
    """The plan of an epoch about to read ``index_sampler``; None where its
    order is not known ahead (a sampler of the user's, a subclass, torch's
    global generator, which the training step draws from too)."""
    if single:
        sampler, batch_size, drop_last = index_sampler, None, False
    elif type(index_sampler) is BatchSampler:
        sampler, batch_size, drop_last = index_sampler.sampler, index_sampler.batch_size, index_sampler.drop_last
    else:
        return None
    kind = type(sampler)
    if kind is SequentialSampler:
        return _Plan(epoch, len(sampler.data_source), batch_size, drop_last, False, False, None, "")
    if kind is not RandomSampler:
        return None
    g = sampler.generator
    if not isinstance(g, torch.Generator) or g.device.type != "cpu":
        return None
    return _Plan(epoch, len(sampler.data_source), batch_size, drop_last, True, bool(sampler.replacement),
                 sampler._num_samples, encode_generator(g))


class _Permutation:
    """torch's ``RandomSampler`` without replacement, iterated as torch
    iterates it: its generator (or, without one, a seed drawn from torch's
    global generator at the first read) draws ``randperm(n)`` at the first
    read and again at the read past each permutation's end; the indices are
    torch's, from the permutation kept as a tensor."""

    def __init__(self, sampler: RandomSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Any:
        s = self.sampler
        n = len(s.data_source)
        own = s.generator is None
        generator = torch.Generator().manual_seed(draw_seed()) if own else s.generator
        num_samples = s.num_samples
        for _ in range(num_samples // n):
            yield from ints(torch.randperm(n, generator=generator))
        if own and num_samples % n == 0:
            return   # torch's last draw is from a generator no one else sees
        yield from ints(torch.randperm(n, generator=generator)[: num_samples % n])


def _lean(sampler: Any) -> Any:
    """``sampler`` (a batch sampler or a sampler), or one giving the same
    indices with the same draws without a list of the whole permutation:
    torch's own ``BatchSampler`` and ``RandomSampler`` without replacement
    (not subclasses: they may draw otherwise)."""
    inner = sampler.sampler if type(sampler) is BatchSampler else sampler
    if type(inner) is not RandomSampler or inner.replacement:
        return sampler
    if inner is sampler:
        return _Permutation(inner)
    return BatchSampler(_Permutation(inner), sampler.batch_size, sampler.drop_last)


class _Batches:
    """The index batches of a torch epoch, as the Loader's batch sampler.

    The sampler is read on the consumer's thread (``read_to``), as torch's
    main process reads it: ``ahead`` (``prefetch_factor * num_workers``)
    batches when the epoch begins, then one more for each batch handed out.
    The Loader's threads take the batches read; its bound on batches opened
    ahead of the consumer keeps them behind the reading. With a plan, the
    threads take the plan's batches instead and what is read is only read
    (for its draws).

    An epoch begins when the Loader iterates it (on the consumer's thread,
    inside ``iter(loader)``), after ``set_epoch`` has told it the Loader's
    number for it; its state is the ``sampler_side`` as it begins.
    """

    def __init__(self, loader: Any, ahead: int) -> None:
        self.sampler = loader._index_sampler
        self.single = not loader._auto_collation   # batch_size=None: each index is a batch of its own
        self.ahead = ahead            # batches torch reads as an epoch begins
        self.lock = threading.Lock()  # the Loader's threads take; the consumer reads and hands out
        self.plan: Optional[_Plan] = None        # the epoch's, where its order is known ahead
        self._next: Optional[_Early] = None      # the next epoch's, once asked for
        self.generators, self.stateful = sampler_side(loader)
        self.pending: Optional[dict[str, Any]] = None   # a state loaded: the next epoch begins there
        self.dropped = 0              # batches of the next epoch the Loader drops (a resume)
        self.number = 0               # the Loader's number for the next epoch
        self.choice = loader._choice  # where the epochs that begin load (_processes.py)
        self.adopted: Optional[_Early] = None   # the epoch begun, where it is the one opened early
        self.cut: Cut   # what the threads take of the epoch begun (set as it begins, before any cut)
        # torch makes an iterator of the sampler when its DataLoader iterator is
        # made, and again as the first epoch begins (a sampler that draws in
        # __iter__ draws twice): so does this.
        self._open()

    # -- the Loader's side ----------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        self.number = epoch

    def state_dict(self) -> dict[str, Any]:
        """The state the next epoch begins from (a loaded one until it begins)."""
        if self.pending is not None:
            return self.pending
        return sampler_part(self.generators, self.stateful)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = state

    def __iter__(self) -> Any:
        """A new torch epoch: a new iteration of the sampler (from a loaded
        state's generators and samplers), ``ahead`` batches read (and those
        the Loader drops); the plan's batches, or the batches read, in order."""
        state, self.pending = self.pending, None
        with contextlib.ExitStack() as drawing:
            if state is not None:
                for g, saved in zip(self.generators, state["generators"]):
                    drawing.enter_context(drawing_from(g, saved))
                for s, saved in zip(self.stateful, state["samplers"]):
                    s.load_state_dict(copy.deepcopy(saved))
            with self.lock:
                plan = _plan(self.sampler, self.single, self.number)
                early, self._next = self._next, None
                self.adopted = early if early is not None and plan == early.plan else None
                # Once processes load the epochs, one opened early is still handed out first.
                self.plan = plan if self.adopted or not self.choice.processes else None
                self._open()
            self.read_to(self.ahead + self.dropped)
        keys = self._take(self.token) if self.plan is None else self.plan.batches()
        if self.adopted is not None and self.choice.processes:
            # Its batches opened early come from the threads, the rest from torch's
            # workers; a Loader that did not adopt them (a thread was reading their
            # keys as the epoch began) opens them again from these.
            self.cut = self.adopted.cut
            return Cut(itertools.islice(keys, self.cut.taken), False, 0)
        self.cut = Cut(keys, self.choice.processes, self.dropped)
        self.dropped = 0
        return self.cut

    def rest(self) -> Optional[Any]:
        """Cuts the epoch begun (consumer's thread): the threads take no more
        of its batches. The index lists left, for torch's worker processes:
        those no thread took (a plan's, from its replay: the same batches,
        then the sampler read to its end for its draws). None where every
        batch was taken. The next epoch's early opening stops too: what was
        opened of it comes first as it begins."""
        cut = self.cut
        if self._next is not None:
            self._next.cut.rest()
        if self.adopted is not None and not cut.taken:
            # The Loader's keys are those opened early: a batch was handed out
            # before this cut, which a Loader that read ``cut`` took from it.
            cut = self.adopted.cut
        with self.lock:
            if self.exhausted and not self.read and (self.plan is None or cut.taken >= self.tries - 1):
                return None   # every batch taken: nothing to cut
        rest = cut.rest()
        return rest if self.plan is None else itertools.chain(rest, self._read_to_end())

    def _read_to_end(self) -> Any:
        """Reads the sampler to its end (its draws), yielding nothing."""
        self.read_to(self.tries + len(self))
        yield from ()

    def _open(self) -> None:
        sampler = _lean(self.sampler)
        self.source = ([i] for i in sampler) if self.single else iter(sampler)
        self.read: collections.deque[Any] = collections.deque()   # read, not taken by a thread
        self.tries = 0            # reads of the sampler this epoch (the one that ended it too)
        self.exhausted = False    # the sampler ended (or raised)
        self.token = object()     # the Loader epoch of an earlier one takes nothing more

    def order(self, epoch: int) -> Any:
        """The plan of the Loader's epoch ``epoch``: the one begun, or the
        next (none once processes load the epochs: none is opened early).
        The next one is made when first asked for (by a persistent loader as
        its next epoch begins), not as this one begins: it costs the draws of
        an epoch (``randperm(n)`` twice), and a loader that is not persistent
        never asks."""
        plan = self.plan
        if plan is None or epoch not in (plan.epoch, plan.epoch + 1):
            return None
        if epoch == plan.epoch:
            return self.adopted or plan
        if self.choice.processes:
            return None
        if self._next is None:
            following = plan.following()
            self._next = _Early(following, Cut(following.batches(), False, 0))
        return self._next

    def read_to(self, tries: int) -> None:
        """Reads the sampler (consumer's thread) until it has been read
        ``tries`` times this epoch or has ended. Its error is the batch's it
        replaces: a loader thread raises it there, in the epoch's order."""
        with self.lock:
            while self.tries < tries and not self.exhausted:
                keys = self._read()
                if type(keys) is _Raise and self.plan is not None:
                    raise keys.exc   # no thread takes what is read: the reader hears it
                if self.plan is None and keys is not _END:
                    self.read.append(keys)

    def _take(self, token: object) -> Any:
        while True:
            with self.lock:
                if self.token is not token:
                    return            # a later epoch began (its batches are its own)
                # Ahead of the reading (the Loader's bound keeps its threads
                # behind it): read here rather than wait.
                keys = self.read.popleft() if self.read else _END if self.exhausted else self._read()
            if keys is _END:
                return
            if type(keys) is _Raise:
                raise keys.exc
            yield keys

    def _read(self) -> Any:
        """The sampler's next batch (the lock held): ``_END`` at its end, its error as a ``_Raise``."""
        self.tries += 1
        try:
            return next(self.source)
        except StopIteration:
            self.exhausted = True
            return _END
        except Exception as exc:
            self.exhausted = True
            return _Raise(exc)

    def __len__(self) -> int:
        return len(self.sampler)


def loader_generator(loader: Any) -> Any:
    """The generator a DataLoader's order and seeds are drawn from: its own, else torch's global one."""
    return loader.generator if loader.generator is not None else torch.default_generator


def sampler_side(loader: Any) -> tuple[list[Any], list[Any]]:
    """What a DataLoader's epoch order is drawn from, saved as an epoch begins
    and restored before a resumed epoch reads its sampler: the generators
    (``loader_generator``'s, then each CPU generator the batch sampler or the
    sampler inside it holds of its own: ``generator=`` of torch's
    ``RandomSampler``, ``WeightedRandomSampler``, ``SubsetRandomSampler``, or
    of a user's sampler), and the user's samplers with a state of their own
    (torchdata's ``Stateful``; never the same object twice: torch refuses a
    sampler beside a batch sampler)."""
    generators = [loader_generator(loader)]
    for sampler in (loader._index_sampler, getattr(loader._index_sampler, "sampler", None)):
        own = getattr(sampler, "generator", None)
        if isinstance(own, torch.Generator) and own.device.type == "cpu" and all(own is not g for g in generators):
            generators.append(own)
    return generators, [s for s in (loader.batch_sampler, loader.sampler) if stateful(s)]


@contextlib.contextmanager
def drawing_from(generator: Any, text: str) -> Any:
    """Draws from ``generator`` set to a resumed state's ``text`` (as
    ``encode_generator`` wrote it). torch's global generator is the user's
    too: where it was elsewhere than the saved state (the user's own,
    restored from the same checkpoint or not), it is put back after; where
    it was there already (a state loaded in the run that saved it), the
    draws stay drawn, as in an uninterrupted run."""
    users = generator.get_state() if generator is torch.default_generator else None
    saved = decode_generator(text).get_state()
    generator.set_state(saved)
    try:
        yield
    finally:
        if users is not None and not torch.equal(users, saved):
            generator.set_state(users)


def sampler_part(generators: list[Any], stateful: list[Any]) -> dict[str, Any]:
    """The sampler side of a resume state: the states of the generators an
    epoch's order is drawn from, and each stateful sampler's own."""
    return {"generators": [encode_generator(g) for g in generators], "samplers": [s.state_dict() for s in stateful]}


def draw_seed(generator: Any = None) -> int:
    """torch's draw of a seed from ``generator`` (None: torch's global one):
    a DataLoader iterator's base seed, a ``RandomSampler``'s without a generator."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def encode_generator(generator: Any) -> str:
    """A CPU generator's state as text (JSON-serialisable)."""
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")


def decode_generator(text: Any) -> Any:
    """A new CPU generator in the state ``encode_generator`` wrote (drawing
    from it draws from a copy); ValueError for one a generator refuses."""
    if not isinstance(text, str):
        raise ValueError(f"a generator state must be text, got {type(text).__name__}")
    state = torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)
    generator = torch.Generator()
    try:
        generator.set_state(state)
    except RuntimeError as exc:
        raise ValueError(f"torch refuses the generator state: {exc}") from None
    return generator


class _Raise(NamedTuple):
    """The sampler's error, read in place of a batch."""
    exc: Exception


_END = object()   # the sampler ended: no batch
