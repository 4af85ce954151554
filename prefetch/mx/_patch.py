"""``patch()``/``unpatch()``: make ``mx.io.PrefetchingIter`` ours, for scripts
that cannot be edited."""
from prefetch.mx._iter import PrefetchingIter
from prefetch.mx._mxnet import mx

_saved = None


def patch(depth=1, **options):
    """Make ``mx.io.PrefetchingIter`` (and ``mxnet.io.io.PrefetchingIter``) ours
    for code that looks it up after this call; ``unpatch()`` restores mx's.

    ``depth`` defaults to 1, so every sequence of calls returns what mx's class
    returned; ``options`` (device, timeout, ...) apply to every instance.
    Code that did ``from mxnet.io import PrefetchingIter`` earlier keeps mx's.
    """
    global _saved
    defaults = dict(options, depth=depth)

    class Patched(PrefetchingIter):
        def __init__(self, iters, rename_data=None, rename_label=None, **kw):
            super().__init__(iters, rename_data, rename_label, **{**defaults, **kw})

    Patched.__name__ = Patched.__qualname__ = "PrefetchingIter"
    Patched.__module__ = __name__
    if _saved is None:
        _saved = mx.io.PrefetchingIter
    mx.io.PrefetchingIter = Patched
    mx.io.io.PrefetchingIter = Patched
    return Patched


def unpatch():
    """Restore ``mx.io.PrefetchingIter``; a no-op when not patched."""
    global _saved
    if _saved is not None:
        mx.io.PrefetchingIter = _saved
        mx.io.io.PrefetchingIter = _saved
        _saved = None
