"""``loading=``: where the torch drop-in's epochs load, and the
hand-over to torch's own worker processes.

With ``loading="auto"`` (the default) an epoch starts on threads. Where the
threads measure that ``dataset[i]`` holds the GIL (the core's gauge: its
notice comes here through ``on_notice`` instead of being raised), they
cannot load faster than one thread, and the worker processes of the
``torch.utils.data.DataLoader`` this one replaces would. If those processes
can run the dataset (the start method is ``fork``, or the dataset,
``collate_fn`` and ``worker_init_fn`` pickle), the batches the threads have
not opened go to torch's own ``_MultiProcessingDataLoaderIter``, built over
a torch ``DataLoader`` that is the user's with its sampler replaced by those
batches and its generator set to give the epoch's base seed: the same
samples, order, batches, ``worker_init_fn``, ``collate_fn``, seeds
(``base_seed + worker_id``), pinning and timeout as torch's. Every later
epoch loads there from its start. One warning says so, with the measured
figure; ``stats().loading`` says ``"processes"``. Where they cannot, the
loader stays on threads and the warning says why.

The hand-over is mid-epoch, at the verdict (within about 0.3 s of loading):
on a GIL-bound dataset the threads load at about the speed of one, so an
epoch finished on them costs the whole epoch at a fraction of torch's speed
(a text dataset measured: 0.59 x), which a run of a few epochs never wins
back; starting torch's workers costs a fork each. Batches the threads opened
are finished by them and handed out first, while torch's workers start:
nothing is loaded twice or skipped. An epoch whose batches were all opened
ends on threads, and the next one starts in processes (with the batches
persistent workers opened early for it, from the threads).

An ``IterableDataset`` is not cut: each worker's position in the stream is
its thread's. With ``loading="processes"`` torch's workers read it from
each epoch's start, as torch's loader does; with ``"auto"`` it stays on
threads and the warning says why.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from prefetch._framework import ProcessEpoch, say_handover, start_method, unpicklable
from prefetch.torch._sampler import decode_generator
from prefetch.torch._torch import torch

# Why a map-style dataset's epoch with in_order=False stays on threads under loading="auto".
OUT_OF_ORDER = ("with in_order=False its state_dict() names each batch handed out, which torch's worker processes "
                "do not report (with in_order=True they take over)")


def why_not_processes(loader: Any) -> Optional[str]:
    """Why torch's worker processes cannot take this loader's epochs; None where they can."""
    if not loader.in_order:
        return OUT_OF_ORDER
    method = start_method(loader.multiprocessing_context)
    if method == "fork":
        return None
    return unpicklable("dataset, collate_fn or worker_init_fn",
                       (loader.dataset, loader.collate_fn, loader.worker_init_fn), f"the {method!r} start method")


# Why a stream's epoch stays on threads under loading="auto".
MID_STREAM = ("an IterableDataset's epoch cannot move to them mid-epoch (each worker's position in the stream is "
              "its thread's); loading='processes' loads it in torch's worker processes from the start")


def say(note: Any, loader: Any, reason: Optional[str]) -> None:
    """The one warning about the GIL notice ``note``: what the DataLoader does (at the user's line)."""
    say_handover(note, reason, framework="torch", loader="torch.utils.data.DataLoader",
                 workers=0 if loader is None else loader.num_workers,
                 method="" if loader is None else start_method(loader.multiprocessing_context),
                 same="the same batches, order, seeds and state_dict()",
                 cannot_run=reason not in (MID_STREAM, OUT_OF_ORDER))


class _Rest:
    """The epoch's index lists not opened by the threads, as torch's iterator
    reads its ``_index_sampler``; fed again for each epoch of persistent workers."""

    def __init__(self, single: bool, length: int) -> None:
        self.single = single   # batch_size=None: torch's sampler gives indices
        self.length = length
        self.batches: Iterator[Any] = iter(())

    def __iter__(self) -> Iterator[Any]:
        return (keys[0] for keys in self.batches) if self.single else self.batches

    def __len__(self) -> int:
        return self.length


def _torch_loader(loader: Any, rest: Optional[_Rest], iterator_rng: str) -> Any:
    """A torch ``DataLoader`` that is ``loader`` (every attribute torch's
    iterator reads: dataset, collate_fn, worker_init_fn, multiprocessing
    context, prefetch_factor, pin_memory, timeout, persistent_workers) with
    ``rest`` as its sampler (None: an IterableDataset's, as it is) and a
    generator set to where ``loader``'s was as its iterator drew the base
    seed (``iterator_rng``), so torch's iterator draws the same seed.
    torch's own class, whatever ``patch()`` rebound."""
    own = next(c for c in type(loader).__mro__
               if c.__module__ == "torch.utils.data.dataloader" and c.__name__ == "DataLoader")
    proxy = own.__new__(own)
    fields = dict(vars(loader))
    generator = torch.Generator()
    generator.set_state(decode_generator(iterator_rng))
    fields.update(generator=generator, _iterator=None)
    if rest is not None:
        fields["batch_sampler" if rest.single is False else "sampler"] = rest
    vars(proxy).update(fields)   # not setattr: torch refuses to change these after __init__
    return proxy


class Workers:
    """torch's worker processes for one DataLoader iterator (persistent
    workers: across its epochs), reading the batches the threads left."""

    def __init__(self, iterator_rng: str) -> None:
        self.iterator_rng = iterator_rng   # the loader's generator as the iterator drew its base seed
        self.proxy: Any = None
        self.it: Optional[_MultiProcessingDataLoaderIter] = None

    def begin(self, loader: Any, batches: Optional[Iterator[Any]]) -> None:
        """An epoch's (or its rest's) index lists, read as torch reads its
        sampler; None: an IterableDataset's epoch, whole, as torch loads it."""
        if self.proxy is None:
            rest = None if batches is None else _Rest(not loader._auto_collation, len(loader))
            self.proxy = _torch_loader(loader, rest, self.iterator_rng)
        if batches is not None:
            self.proxy._index_sampler.batches = batches
        if self.it is None:
            self.it = _MultiProcessingDataLoaderIter(self.proxy)   # starts the workers, reads ahead
        else:
            self.it._reset(self.proxy)   # persistent workers: torch's next epoch on the same ones

    def close(self) -> None:
        """torch's own shutdown (bounded: it joins, then terminates): no process is left."""
        it, self.it = self.it, None
        if it is not None:
            it._shutdown_workers()


class TorchEpoch(ProcessEpoch):
    """An epoch that torch's workers finish (its batches taken here)."""

    def __init__(self, source: Any, workers: Workers, handed: int, stream: bool) -> None:
        super().__init__(source, handed)
        self.workers = workers
        self.stream = stream   # an IterableDataset's: its workers' positions are theirs

    def take(self) -> Any:
        """torch's next batch (its conversion, pinning and timeout); a batch
        whose error torch raises is counted as handed out, as on threads.
        (torch's count of batches received also passes those of a stream's
        workers that ended: one a call.)"""
        it = self.workers.it
        assert it is not None
        before = it._rcvd_idx
        try:
            return next(it)
        except StopIteration:
            self.finished = True
            before = it._rcvd_idx
            raise
        finally:
            self.handed += min(1, it._rcvd_idx - before)

    def state_dict(self) -> dict[str, Any]:
        if self.stream and self.handed and not self.finished:
            raise ValueError(STREAM_STATE)
        return super().state_dict()

    def close(self) -> None:
        self.workers.close()
        self.source.close()


STREAM_STATE = ("an IterableDataset loaded with loading='processes' has a state between epochs only: its "
                "workers' positions in the stream are in torch's worker processes (loading='threads' gives "
                "one at every batch)")

