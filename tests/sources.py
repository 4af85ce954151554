"""Sources used by several test files: each misbehaves the way real loaders do."""
import threading

import numpy as np


class RefillingSource:
    """Hands out the same buffer every time, refilled in place with batch i
    (SPEC §3 rule 3): the pattern of MXNet's C++ prefetcher and FFCV."""

    def __init__(self, n, shape=(64, 33)):
        self.n = n
        self.buf = np.empty(shape, dtype=np.float32)
        self.label = np.empty(shape[0], dtype=np.int64)

    def __iter__(self):
        for i in range(self.n):
            self.buf[...] = i
            self.label[...] = -i
            yield (self.buf, {"label": self.label[::2], "i": i})

    def expected(self, i):
        return np.full(self.buf.shape, i, np.float32), np.full(self.label[::2].shape, -i, np.int64)


class BlockingSource:
    """Yields `ready` batches, then blocks in next() until released."""

    def __init__(self, ready=0, then=()):
        self.ready = ready
        self.then = list(then)
        self.release = threading.Event()
        self.entered = threading.Event()

    def __iter__(self):
        for i in range(self.ready):
            yield np.full(3, i)
        self.entered.set()
        self.release.wait()
        yield from self.then
