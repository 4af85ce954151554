"""How a user's typed training loop uses prefetch; tests/run.sh runs `mypy --strict` on this file
against the installed package (so the wheel must carry py.typed and the stubs). Not executed."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from prefetch import ClosedError, Prefetcher, Stats

Batch = tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]


def loader(n: int) -> Iterator[Batch]:
    for i in range(n):
        yield np.zeros((8, 3), np.float32), np.full(8, i, np.int64)


def train(epochs: int) -> float:
    total = 0.0
    with Prefetcher(loader(epochs), depth=4, workers=2, timeout=30.0, name="train") as batches:
        for images, labels in batches:
            total += float(images.sum()) + float(labels.sum())
        stats: Stats = batches.stats()
    waited: float = stats.consumer_wait_s + stats.producer_wait_s
    try:
        next(batches)
    except ClosedError as e:
        print(e)
    return total + waited
