"""``loading=``: where the torch drop-in's epochs load, and the
hand-over to torch's own worker processes (docs/dropins.md says what the
user sees).

Where the threads measure that ``dataset[i]`` holds the GIL (the core's
notice, passed here through ``on_notice``), the batches they have not opened
go to torch's own ``_MultiProcessingDataLoaderIter`` (``Workers.begin``):
the same samples, order, seeds, ``worker_init_fn``, ``collate_fn``, pinning
and timeout as torch's; the batches the threads opened are finished by them
and handed out first. The hand-over is mid-epoch, at the verdict: on a
GIL-bound dataset an epoch finished on threads costs the whole epoch at a
fraction of torch's speed (a text dataset measured: 0.59 x), which a run of
a few epochs never wins back. An ``IterableDataset`` is not cut (``MID_STREAM``).
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

from torch.utils.data.dataloader import DataLoader as TorchDataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from prefetch._framework import Choice, ProcessEpoch, for_processes, say_handover, start_method, unpicklable
from prefetch.torch._sampler import decode_generator
from prefetch.torch._worker import DATASETS

# Why an epoch stays on threads under loading="auto" though torch's worker processes could run the dataset.
OUT_OF_ORDER = ("with in_order=False its state_dict() names each batch handed out, which torch's worker processes "
                "do not report (with in_order=True they take over)")
MID_STREAM = ("an IterableDataset's epoch cannot move to them mid-epoch (each worker's position in the stream is "
              "its thread's); loading='processes' loads it in torch's worker processes from the start")


def decide(choice: Choice, loader: Any, stream: bool) -> bool:
    """The GIL notice ``choice`` holds, acted on once per DataLoader: True
    where torch's worker processes now take the epochs of ``loader`` (None:
    the iterator outlived it, nothing to build torch's from); the one
    warning, at the user's line, says what and why."""
    def why_not() -> Optional[str]:
        if loader is None:
            return "its DataLoader is gone"
        if stream:
            return MID_STREAM
        if not loader.in_order:
            return OUT_OF_ORDER
        method = start_method(loader.multiprocessing_context)
        if method == "fork":
            return None
        return unpicklable("dataset, collate_fn or worker_init_fn",
                           (loader.dataset, loader.collate_fn, loader.worker_init_fn), f"the {method!r} start method")

    def say(note: Any, reason: Optional[str]) -> None:
        say_handover(note, reason, framework="torch", loader="torch.utils.data.DataLoader",
                     workers=0 if loader is None else loader.num_workers,
                     method="" if loader is None else start_method(loader.multiprocessing_context),
                     same="the same batches, order, seeds and state_dict()",
                     cannot_run=reason not in (MID_STREAM, OUT_OF_ORDER))
    return choice.decide(why_not, say)


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
        if batches is not None and not loader._auto_collation:
            batches = (keys[0] for keys in batches)   # batch_size=None: torch's sampler gives indices
        if self.it is None:
            # torch's own class (patch() never rebinds it where torch defines it) as
            # ``loader`` with ``batches`` as its sampler (None: an IterableDataset's, as
            # it is) and its generator where this iterator drew the base seed: torch's
            # iterator draws the same seed. Not setattr: torch refuses to change these.
            self.proxy = TorchDataLoader.__new__(TorchDataLoader)
            fields = dict(vars(loader), generator=decode_generator(self.iterator_rng), _iterator=None,
                          dataset=for_processes(loader.dataset, DATASETS))
            if batches is not None:
                fields["batch_sampler" if loader._auto_collation else "sampler"] = batches
            vars(self.proxy).update(fields)
            self.it = _MultiProcessingDataLoaderIter(self.proxy)   # starts the workers, reads ahead
            return
        if batches is not None:
            self.it._index_sampler = batches   # what torch's _reset() iterates (at first: the proxy's)
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

