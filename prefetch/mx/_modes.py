"""MXNet's NumPy modes carried over to the publisher and loader threads, registered on import.

``npx.set_np()`` turns on NumPy-shape semantics (0-d and empty shapes valid)
and NumPy-array semantics (Gluon's batchify and blocks make and take
``mx.np.ndarray``), and MXNet keeps both per thread. A source runs on the
prefetcher's publisher thread (a dataset on a loader's threads): without its creator's modes a Gluon DataLoader's
batchify would stack mx.np samples with a legacy operator (a TypeError) and
0-d arrays would be unknown shapes. So each Prefetcher's or Loader's
constructor captures the modes of its thread, and those threads set them before their first
``next(source)`` (or ``dataset[i]``).

Threading contract: ``capture_np_modes`` runs in the Prefetcher's or Loader's constructor;
``_apply`` on those threads, before the source runs there.
"""
import functools

from prefetch._framework import register_thread_state
from prefetch.mx._mxnet import mx


def capture_np_modes():
    """The modes of this thread to set on a publisher or loader thread, or None when off (the
    default of a new thread)."""
    shape, array = mx.util.is_np_shape(), mx.util.is_np_array()
    if not (shape or array):
        return None
    return functools.partial(_apply, shape, array)


def _apply(shape, array):
    if shape:
        mx.util.set_np_shape(True)
    if array:
        mx.util._set_np_array(True)   # what npx.set_np() calls; no public setter alone


register_thread_state(capture_np_modes)
