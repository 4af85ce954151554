"""The workload of bench_mx_e2e: Module.fit of a small MLP fed with no prefetcher,
mx.io.PrefetchingIter or prefetch.mx.PrefetchingIter, epochs interleaved.

The source is a DataIter that "decodes" every batch with numpy work that releases
the GIL (a stand-in for JPEG decoding/augmentation), so prefetching can overlap it
with the training step.  ``epoch_times()`` is the entry point for the bench suite.
"""

import logging
import os
import time
import warnings

import numpy as np

os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")  # no "MKLDNN is activated" lines
# One core for the model, the rest for the data pipeline: on a 2-core machine an
# OMP team on both cores would fight the decode thread (set it to measure otherwise).
os.environ.setdefault("OMP_NUM_THREADS", "1")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # mxnet 1.9.1 uses np.bool
    import mxnet as mx

import prefetch.mx as pmx

KINDS = ("none", "mx", "prefetch")
FEATURES, HIDDEN, CLASSES, BATCH = 256, 512, 10, 128
DECODE = 96  # decode work per feature: sized so decoding ~ one training step


class DecodingIter(mx.io.DataIter):
    """Yields (BATCH, FEATURES) batches, each built by GIL-releasing numpy work."""

    def __init__(self, n_batches, seed=0):
        super().__init__(BATCH)
        rng = np.random.RandomState(seed)
        self.n_batches = n_batches
        self.centers = rng.normal(0, 1, (CLASSES, FEATURES)).astype(np.float32)
        self.labels = rng.randint(0, CLASSES, (n_batches, BATCH))
        self.noise = rng.normal(0, 1, (BATCH, FEATURES, DECODE)).astype(np.float32)
        self.k = 0
        self.provide_data = [mx.io.DataDesc("data", (BATCH, FEATURES))]
        self.provide_label = [mx.io.DataDesc("softmax_label", (BATCH,))]

    def reset(self):
        self.k = 0

    def next(self):
        if self.k >= self.n_batches:
            raise StopIteration
        y = self.labels[self.k]
        self.k += 1
        # "decode": single-threaded numpy ufuncs and a reduction, without the GIL.
        x = np.sin(self.noise * np.float32(1 + self.k % 7)).mean(axis=2)
        x += self.centers[y]
        return mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)], pad=0)


def _mlp():
    data = mx.sym.Variable("data")
    h = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=HIDDEN), act_type="relu")
    h = mx.sym.Activation(mx.sym.FullyConnected(h, num_hidden=HIDDEN), act_type="relu")
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(h, num_hidden=CLASSES), name="softmax")


def _train_iter(kind, n_batches, depth):
    src = DecodingIter(n_batches)
    if kind == "none":
        return src
    if kind == "mx":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Thread.setDaemon
            return mx.io.io.PrefetchingIter(src)
    if kind == "prefetch":
        return pmx.PrefetchingIter(src, depth=depth)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def _close(kind, it):
    if kind == "prefetch":
        it.close()
    elif kind == "mx":
        for ready in it.data_ready:  # a __del__() during a fetch hangs its join()
            ready.wait()
        it.__del__()


def epoch_times(kinds=KINDS, epochs=2, quick=False, depth=4):
    """Seconds per Module.fit epoch for each kind, epochs interleaved across kinds.

    Returns ``{kind: [seconds of epoch 0, epoch 1, ...]}``.  Epoch 0 includes
    warm-up.  The model's OMP threads are fixed when mxnet is first imported: this
    module sets OMP_NUM_THREADS=1 unless set, which only works if it imports mxnet
    first (set it in the environment when mxnet was imported before).
    """
    n_batches = 24 if quick else 120
    logger = logging.getLogger("bench_mx_fit")
    logger.setLevel(logging.ERROR)  # fit() logs "Already bound" on every later call
    runs = {}
    for kind in kinds:
        mx.random.seed(0)
        mod = mx.mod.Module(_mlp(), context=mx.cpu(), logger=logger)
        runs[kind] = (mod, _train_iter(kind, n_batches, depth))
    times = {kind: [] for kind in kinds}
    try:
        for epoch in range(epochs):
            for kind in kinds:
                mod, it = runs[kind]
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    # later fit() calls: "Parameters already initialized ... ignored"
                    warnings.simplefilter("ignore", UserWarning)
                    mod.fit(it, begin_epoch=epoch, num_epoch=epoch + 1, optimizer="sgd",
                            optimizer_params={"learning_rate": 0.05},
                            initializer=mx.init.Xavier())
                mx.nd.waitall()
                times[kind].append(time.perf_counter() - t0)
    finally:
        for kind, (_, it) in runs.items():
            _close(kind, it)
    return times
