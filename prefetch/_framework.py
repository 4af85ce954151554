"""The Loader behind a framework's DataLoader drop-in (in the adapter
folders): what the drop-ins share, so each fix lands once.

A drop-in reads its framework's sampler where the framework reads it and
gives the Loader the epoch's index lists as its ``batch_sampler``. The
Loader passes each index to ``dataset[...]`` as the framework does, whatever
it is (a list for bulk loading, a numpy integer, a key of the dataset's
own): the dataset raises for a bad one, as under the framework's loader.
Where that batch sampler knows an epoch's order before it starts
(``order(epoch)``, a plan with ``batches()``), the next epoch's first
batches load while this one's last are consumed. A ``GILBoundWarning``
points to the framework's own process loader.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from prefetch._core import MAP_KEYS_UNCHECKED
from prefetch.loader import Loader


class FrameworkLoader(Loader):  # type: ignore[type-arg]
    """A Loader over a drop-in's batch sampler.

    ``remedy``: the framework's process loader, named in the GIL warning.
    ``per_thread``: (dataset, worker_id) -> that thread's dataset, where the
    threads cannot share it (a RecordIO reader with its own position).
    ``lookahead``: at most that many batches opened and not yet taken (a
    framework's ``prefetch_factor * num_workers``; 0: the Loader's own
    bounds only). ``go_on``: a batch whose sample or collate raised is that
    batch's error and the epoch goes on, as some frameworks' loaders do."""

    def __init__(self, dataset: Any, *, remedy: str, per_thread: Optional[Callable[[Any, int], Any]] = None,
                 lookahead: int = 0, go_on: bool = False, **kwargs: Any) -> None:
        self._per_thread = per_thread
        super().__init__(dataset, **kwargs)
        stage = self._stage
        stage.gauge.remedy = f"{remedy} (processes), wrapped in prefetch.Prefetcher to keep the same batch guarantees"
        stage.set_lookahead(lookahead)
        stage.set_continue_after_failure(go_on)

    def _keys(self, epoch: int) -> tuple[Iterator[list[Any]], int, int]:
        batches, _, rows = super()._keys(epoch)
        return batches, MAP_KEYS_UNCHECKED, rows

    def _order(self, epoch: int) -> Any:
        order = getattr(self.batch_sampler, "order", None)
        return None if order is None else order(epoch)

    def _order_batches(self, plan: Any) -> Iterator[list[Any]]:
        return plan.batches()  # type: ignore[no-any-return]
