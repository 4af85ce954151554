"""``loading=``: where the Gluon drop-in's passes load, and the hand-over
to Gluon's own worker pool.

With ``loading="auto"`` (the default) a pass starts on threads. Where they
measure that ``dataset[i]`` holds the GIL (the core's notice, passed here
through ``on_notice`` instead of being raised), they cannot load faster
than one thread, and the process pool of the ``mx.gluon.data.DataLoader``
this one replaces would. If that pool can run the dataset (its start method
is ``fork``, or the dataset pickles; ``batchify_fn`` pickles, as Gluon sends
it with each batch), the index lists the threads have not opened go to a
Gluon ``DataLoader(num_workers=N, thread_pool=False)`` over a batch sampler
of those lists, with the user's ``batchify_fn`` (None: Gluon's own default
for processes), pinning, prefetch and timeout: the same samples, batches
and order (``last_batch`` is the user's batch sampler's, read on this side).
Every later pass loads there from its start. One warning says so, with the
measured figure; ``stats().loading`` says ``"processes"``. Where the pool
cannot, the loader stays on threads and the warning says why.

The hand-over is mid-pass: the batches the threads opened are finished by
them and handed out first, while Gluon's workers start; nothing is loaded
twice or skipped.
"""
from prefetch._framework import say_handover, start_method, unpicklable
from prefetch.mx._mxnet import mx


def why_not_processes(dataset, batchify_fn):
    """Why Gluon's worker pool cannot run this dataset; None where it can."""
    reason = unpicklable("batchify_fn", (batchify_fn,), "Gluon's worker pool, which sends it with each batch,")
    method = start_method()
    if reason is None and method != "fork":
        reason = unpicklable("dataset", (dataset,), f"the {method!r} start method")
    return reason


def say(note, workers, reason):
    """The one warning about the GIL notice ``note``, at the user's line."""
    say_handover(note, reason, framework="Gluon", loader="mxnet.gluon.data.DataLoader", workers=workers,
                 method=start_method(), same="the same batches, order and batchify_fn")


class Pool:
    """Gluon's own worker pool for one DataLoader: made at the first hand-over,
    kept across its passes, ended by ``close()``."""

    def __init__(self, dataset, batchify_fn, workers, pin_memory, pin_device_id, prefetch, timeout):
        self.gluon = mx.gluon.data.DataLoader(
            dataset, batch_sampler=[], batchify_fn=batchify_fn, num_workers=workers,
            pin_memory=pin_memory, pin_device_id=pin_device_id, prefetch=prefetch, thread_pool=False,
            timeout=timeout)

    def batches(self, keys):
        """Gluon's batches of the index lists ``keys``, in their order, its
        workers loading from now (refresh(): Gluon's own start of a pass)."""
        self.gluon._batch_sampler = keys   # what refresh() reads, as Gluon's DataLoader made it
        self.gluon.refresh()
        return iter(self.gluon)

    def close(self):
        """Gluon's pool terminated and joined: no process is left."""
        gluon, self.gluon = self.gluon, None
        pool = None if gluon is None else gluon._worker_pool
        if pool is not None:
            gluon._worker_pool = None   # Gluon's __del__ has nothing left to end
            pool.terminate()
            pool.join()
