"""MXNet's NumPy modes carried over to the fetch thread, registered on import.

``npx.set_np()`` turns on NumPy-shape semantics (0-d and empty shapes valid)
and NumPy-array semantics (Gluon's batchify and blocks make and take
``mx.np.ndarray``), and MXNet keeps both per thread. A source runs on the
prefetcher's fetch thread: without its creator's modes a Gluon DataLoader's
batchify would stack mx.np samples with a legacy operator (a TypeError) and
0-d arrays would be unknown shapes. So each Prefetcher's constructor captures
the modes of its thread, and its fetch thread sets them before its first
``next(source)``.

Threading contract: ``capture_np_modes`` runs in the Prefetcher constructor;
``_apply`` on the fetch thread, before the source runs there.
"""
import functools

from prefetch.adapters import register_thread_state
from prefetch.mx._mxnet import mx


def capture_np_modes():
    """The modes of this thread to set on a fetch thread, or None when off (the
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
