"""Module.fit / Module.score through prefetch.mx.PrefetchingIter, unchanged (SPEC §6)."""

import logging
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # mxnet 1.9.1 uses np.bool
    mx = pytest.importorskip("mxnet")

import prefetch.mx as pmx  # noqa: E402


def blobs(n=1200, features=16, classes=4, seed=0):
    rng = np.random.RandomState(seed)
    centers = rng.normal(0, 3, (classes, features))
    y = rng.randint(0, classes, n)
    x = centers[y] + rng.normal(0, 1, (n, features))
    return x.astype(np.float32), y.astype(np.float32)


def mlp(classes=4):
    data = mx.sym.Variable("data")
    h = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=32), act_type="relu")
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(h, num_hidden=classes), name="softmax")


def train_and_score(wrap):
    x, y = blobs()
    train = wrap(mx.io.NDArrayIter(x[:1000], y[:1000], 50, shuffle=False))
    val = wrap(mx.io.NDArrayIter(x[1000:], y[1000:], 50))
    mx.random.seed(1)
    np.random.seed(1)
    mod = mx.mod.Module(mlp(), context=mx.cpu(), logger=logging.getLogger("mx-test"))
    mod.fit(train, eval_data=val, num_epoch=3, optimizer="sgd",
            optimizer_params={"learning_rate": 0.1},
            initializer=mx.init.Xavier(rnd_type="uniform", magnitude=2.0))
    accuracy = dict(mod.score(val, "acc"))["accuracy"]
    for it in (train, val):
        getattr(it, "close", lambda: None)()
    return accuracy


def test_module_fit_same_accuracy_as_without_prefetching():
    """§6: Module.fit/score unchanged; same batches, so the same accuracy."""
    plain = train_and_score(lambda it: it)
    ours = train_and_score(lambda it: pmx.PrefetchingIter(it, depth=3))
    assert plain > 0.9
    assert ours == pytest.approx(plain, abs=1e-6)
