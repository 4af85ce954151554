"""What people use today, written the way a user would write it (not tuned).

Also the optional imports (prefetch_generator, mxnet): a missing one returns a
reason, and the section turns its rows into a note.
"""
from __future__ import annotations

import contextlib
import queue
import threading

import numpy as np


def load_mx():
    try:
        import mxnet as mx
        return mx, None
    except Exception as e:  # noqa: BLE001 - ImportError, or mxnet's own failure on this numpy
        return None, f"mxnet not importable ({type(e).__name__}: {str(e)[:80]})"


def load_bg():
    try:
        from prefetch_generator import BackgroundGenerator
        return BackgroundGenerator, None
    except ImportError as e:
        return None, f"prefetch_generator not importable ({type(e).__name__})"


def copy_tree(x):
    """What a careful user writes: np.copy every array leaf, rebuild containers."""
    if isinstance(x, np.ndarray):
        return np.copy(x)
    if isinstance(x, tuple):
        return tuple(copy_tree(v) for v in x)
    if isinstance(x, list):
        return [copy_tree(v) for v in x]
    if isinstance(x, dict):
        return {k: copy_tree(v) for k, v in x.items()}
    return x


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


_END = object()


class QueuePrefetcher:
    """threading + queue.Queue(maxsize=depth): the textbook thread prefetcher.

    copy=False hands the source's own objects through (unsafe with sources that
    refill a buffer); copy=True np.copy's every array leaf: the naive safe one.
    """

    def __init__(self, source, depth=4, copy=False):
        self._q = queue.Queue(maxsize=depth)
        self._stop = False
        self._copy = copy
        self._t = threading.Thread(target=self._run, args=(iter(source),), daemon=True)
        self._t.start()

    def _run(self, it):
        try:
            for b in it:
                if self._stop:
                    return
                self._q.put(copy_tree(b) if self._copy else b)
        except BaseException as e:  # noqa: BLE001 - delivered to the consumer, never lost
            self._q.put(_Raised(e))
        self._q.put(_END)

    def __iter__(self):
        return self

    def __next__(self):
        x = self._q.get()
        if x is _END:
            self._q.put(_END)
            raise StopIteration
        if type(x) is _Raised:
            raise x.exc
        return x

    def close(self):
        self._stop = True
        try:
            while True:
                self._q.get_nowait()
        except queue.Empty:
            pass
        self._t.join(2.0)


def close_quietly(it):
    """close() what has it; mx.io.PrefetchingIter only stops in __del__."""
    for name in ("close", "__del__"):
        f = getattr(it, name, None)
        if f is not None:
            with contextlib.suppress(Exception):  # a row's close failing is not the benchmark's business
                f()
            return


def mx_source_iter(mx, n, arrays, label=None):
    """A minimal mx.io.DataIter that hands out one pre-built DataBatch n times.

    mx.io.PrefetchingIter only accepts DataIters, so the tiny batch is wrapped
    this way; its own plain loop is the baseline for the MXNet rows.
    """

    class _Src(mx.io.DataIter):
        def __init__(self):
            super().__init__(batch_size=arrays[0].shape[0])
            self._n = n
            self._i = 0
            d = [mx.nd.array(a) for a in arrays]
            lab = [mx.nd.array(label)] if label is not None else None
            self._batch = mx.io.DataBatch(data=d, label=lab, pad=0)
            self.provide_data = [mx.io.DataDesc(f"data{i}", a.shape, a.dtype) for i, a in enumerate(arrays)]
            self.provide_label = ([mx.io.DataDesc("label", label.shape, label.dtype)]
                                  if label is not None else [])

        def reset(self):
            self._i = 0

        def next(self):
            if self._i >= self._n:
                raise StopIteration
            self._i += 1
            return self._batch

    return _Src()
