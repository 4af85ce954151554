"""How a Loader's default collate stacks NDArrays: each sample's values are
read to the host (``asnumpy()`` waits for the engine), copied into its row of
a pooled block, and the block becomes one NDArray through DLPack, without a
copy; numpy-mode arrays (``mx.np.ndarray``) stay numpy-mode."""
from __future__ import annotations

import functools
import operator

from prefetch._framework import register_collate
from prefetch.mx._mxnet import mx

_as_numpy = operator.methodcaller("asnumpy")
register_collate(mx.nd.NDArray, _as_numpy, functools.partial(mx.nd.from_numpy, zero_copy=True))
register_collate(mx.np.ndarray, _as_numpy, functools.partial(mx.nd.from_numpy, zero_copy=True, array_cls=mx.np.ndarray))
