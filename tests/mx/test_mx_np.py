"""MXNet's NumPy interface and DataBatch state (SPEC §3, issue 18 item 10):
``mx.np.ndarray`` leaves keep their type, 0-d and empty arrays made under
``npx.set_np()`` are copied though NumPy-shape mode is per thread, and every
NDArray attribute of a DataBatch is copied, not only data/label/index."""

import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # mxnet 1.9.1 uses np.bool
    mx = pytest.importorskip("mxnet")

from mxnet import np as mnp  # noqa: E402
from mxnet import npx  # noqa: E402

import prefetch  # noqa: E402
import prefetch.mx as pmx  # noqa: E402
from support import python_output  # noqa: E402


@pytest.fixture
def np_mode():
    """npx.set_np() on this (the consumer's) thread for one test."""
    npx.set_np()
    try:
        yield
    finally:
        npx.reset_np()


def one(batch, **kw):
    with prefetch.Prefetcher([batch], **kw) as p:
        (out,) = list(p)
    return out


def test_mx_np_leaves_come_out_as_mx_np():
    """§3: an mx.np.ndarray leaf comes out as an mx.np.ndarray (numpy-mode Gluon
    blocks reject legacy NDArrays), a legacy NDArray as a legacy NDArray."""
    src = {"np": mnp.arange(12).reshape(3, 4), "nd": mx.nd.ones((2, 2))}
    out = one(src)
    assert type(out["np"]) is mnp.ndarray and type(out["nd"]) is mx.nd.NDArray
    assert (out["np"].asnumpy() == np.arange(12).reshape(3, 4)).all()
    src["np"][:] = -1
    mx.nd.waitall()
    assert out["np"].asnumpy()[0, 0] == 0


@pytest.mark.parametrize("device", [None, mx.cpu(0)], ids=["own-context", "device"])
@pytest.mark.parametrize("make", [
    lambda: mnp.array(3.5), lambda: mnp.zeros((0, 3)), lambda: mnp.ones((2, 0, 4)),
    lambda: mx.nd.ones(()), lambda: mx.nd.zeros((0, 2)),
], ids=["np-0d", "np-empty", "np-empty-middle", "nd-0d", "nd-empty"])
def test_zero_d_and_empty_arrays_under_set_np_are_copied(np_mode, make, device):
    """Issue 18 item 10: under npx.set_np() (the consumer's thread only) a 0-d or
    empty array is copied on the fetch thread (legacy mode there), not the end of
    the stream with "_copyto inferring shapes failed"; the batch after it too."""
    src = make()
    with prefetch.Prefetcher([src, mnp.ones((2,))], device=device) as p:
        out, after = list(p)
    assert type(out) is type(src) and out.shape == src.shape
    assert (out.asnumpy() == src.asnumpy()).all()
    assert after.asnumpy().tolist() == [1.0, 1.0]


def test_data_batch_extra_ndarray_attributes_are_copied():
    """Issue 18 item 10: a detection pipeline's DataBatch carries im_info (and any
    attribute it likes) beside data/label/index: its NDArrays are copied too, the
    source's later writes do not show; plain attributes pass through."""
    im_info = mx.nd.array([[480, 640, 1.0]])
    batch = mx.io.DataBatch(data=[mx.nd.ones((1, 3))], label=[mx.nd.zeros((1,))], pad=1)
    batch.im_info = im_info
    batch.extras = {"gt": [mnp.ones((2, 4))], "tag": "voc"}
    out = one(batch)
    assert type(out) is mx.io.DataBatch and out.pad == 1 and out.extras["tag"] == "voc"
    assert out.im_info is not im_info and out.extras["gt"][0] is not batch.extras["gt"][0]
    assert type(out.extras["gt"][0]) is mnp.ndarray
    im_info[:] = 0
    batch.extras["gt"][0][:] = 7
    mx.nd.waitall()
    assert out.im_info.asnumpy().tolist() == [[480, 640, 1.0]]
    assert (out.extras["gt"][0].asnumpy() == 1).all()


class NumpyModeIter(mx.io.DataIter):
    """A DataIter that makes its batches the way Gluon's batchify does: mx.np
    arrays (0-d ones included) when NumPy-array mode is on, else NDArrays."""

    def __init__(self, n):
        super().__init__(batch_size=1)
        self.n = n
        self.i = 0

    def reset(self):
        self.i = 0

    def next(self):
        if self.i == self.n:
            raise StopIteration
        self.i += 1
        if mx.util.is_np_array():
            data = [mnp.full((), self.i), mnp.full((1, 2), self.i)]
        else:
            data = [mx.nd.full((1,), self.i), mx.nd.full((1, 2), self.i)]
        return mx.io.DataBatch(data=data, label=None, pad=0)


def test_prefetching_iter_runs_sources_in_the_creators_np_modes(np_mode):
    """Issue 18 item 10: the wrapped iterators run on the fetch thread in the NumPy
    shape/array modes of the thread that made the PrefetchingIter, as they would
    without it: mx.np batches, 0-d ones valid."""
    with pmx.PrefetchingIter(NumpyModeIter(3)) as it:
        got = list(it)
    assert [type(d) for d in got[0].data] == [mnp.ndarray, mnp.ndarray]
    assert [b.data[0].shape for b in got] == [()] * 3
    assert [float(b.data[0]) for b in got] == [1.0, 2.0, 3.0]


def test_prefetching_iter_in_legacy_mode_stays_legacy():
    with pmx.PrefetchingIter(NumpyModeIter(2)) as it:
        got = list(it)
    assert [type(d) for d in got[0].data] == [mx.nd.NDArray, mx.nd.NDArray]


def test_gluon_dataloader_under_set_np_runs_in_numpy_mode_on_the_fetch_thread():
    """Issue 18 item 10: the source runs on the fetch thread in the NumPy modes of the
    thread that made the Prefetcher (MXNet keeps them per thread): a Gluon
    DataLoader's batchify stacks mx.np samples into mx.np batches there, as in a
    plain loop, instead of failing with a legacy operator. In a fresh interpreter,
    where no MXNet object has reached a batch yet (the adapter is imported by the
    constructor because mxnet is)."""
    out = python_output(
        "import sys, warnings\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from mxnet import np as mnp, npx, gluon\n"
        "import prefetch\n"
        "npx.set_np()\n"
        "ds = gluon.data.ArrayDataset(mnp.arange(12).reshape(6, 2), mnp.arange(6))\n"
        "loader = gluon.data.DataLoader(ds, batch_size=4)\n"
        "plain = [[type(x).__name__ for x in b] for b in loader]\n"
        "with prefetch.Prefetcher(loader) as p:\n"
        "    got = list(p)\n"
        "print(plain == [[type(x).__name__ for x in b] for b in got], plain[0])\n"
        "print([b[1].asnumpy().tolist() for b in got])\n")
    assert out == "True ['ndarray', 'ndarray']\n[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]\n"


def test_source_making_0d_arrays_under_set_np(np_mode):
    """A generator that makes 0-d mx.np arrays runs on the fetch thread with the
    consumer's NumPy-shape mode: 0-d shapes are valid there."""
    def src():
        for i in range(3):
            yield mnp.full((), i) + 1
    with prefetch.Prefetcher(src()) as p:
        got = list(p)
    assert [(type(b), b.shape, float(b)) for b in got] == [(mnp.ndarray, (), i + 1.0) for i in range(3)]
