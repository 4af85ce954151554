"""``prefetch.mx.DataLoader``: Gluon's ``DataLoader`` (MXNet 1.9.1) on threads.

A subclass of ``mx.gluon.data.DataLoader`` (so code that checks for one, such
as Gluon's Estimator, takes it) whose constructor never calls Gluon's: that
one starts a process pool. It validates its arguments as Gluon's does,
builds Gluon's own samplers, and loads with a ``prefetch.Loader``.

Threading contract: ``_ReaderPerThread.__getitem__`` and ``_InitThread`` run
on loader threads; everything else on the consumer's thread.
"""
import copy
import multiprocessing
import threading

from prefetch import Loader
from prefetch.mx._mxnet import mx

_gluon_data = mx.gluon.data
_default_batchify_fn = _gluon_data.dataloader.default_batchify_fn


def _holds_reader(dataset):
    """Whether ``dataset`` is a ``RecordFileDataset`` or holds one in an
    attribute (Gluon's wrappers: ``transform``, ``transform_first``, ``take``...)."""
    if isinstance(dataset, _gluon_data.RecordFileDataset):
        return True
    return isinstance(dataset, _gluon_data.Dataset) and any(
        _holds_reader(value) for value in getattr(dataset, "__dict__", {}).values() if isinstance(value, _gluon_data.Dataset))


def _with_own_readers(dataset):
    """``dataset`` for one thread: a shallow copy with a RecordIO reader of its
    own wherever it holds a ``RecordFileDataset``. A reader's seek-then-read is
    not atomic, so threads cannot share one; each of Gluon's worker processes
    gets its own the same way, by copy."""
    own = copy.copy(dataset)
    if isinstance(dataset, _gluon_data.RecordFileDataset):
        own._record = mx.recordio.MXIndexedRecordIO(dataset.idx_file, dataset.filename, "r")
    else:
        for name, value in getattr(dataset, "__dict__", {}).items():
            if _holds_reader(value):
                setattr(own, name, _with_own_readers(value))
    return own


class _ReaderPerThread:
    """A dataset that holds a RecordIO reader, read by each loader thread
    through its own copy (made on the thread's first sample; closed with the
    thread)."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.local = threading.local()

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, idx):
        try:
            mine = self.local.dataset
        except AttributeError:
            mine = self.local.dataset = _with_own_readers(self.dataset)
        return mine[idx]


class _Batches:
    """The batch sampler seen only as an iterable of index lists, so the Loader
    finds no ``set_epoch`` to call on it."""

    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler

    def __iter__(self):
        return iter(self.batch_sampler)

    def __len__(self):
        return len(self.batch_sampler)


class DataLoader(_gluon_data.DataLoader):
    """``mx.gluon.data.DataLoader`` with the same signature, samplers and
    batches, loading on ``num_workers`` threads (one when it is 0).

    The dataset is shared by the threads, not pickled: a dataset holding
    locks, open files, generators, weak references or ``multiprocessing``
    objects works, and ``dataset[i]`` must allow being called by several
    threads at once. A ``RecordFileDataset`` (``ImageRecordDataset``
    included, also under ``transform``/``transform_first``) is read by each
    thread through a reader of its own.

    Differences from Gluon's:
    - ``thread_pool`` is accepted and ignored: it is always threads, and no
      shared memory is used (``batchify_fn`` defaults to
      ``default_batchify_fn``, batches on ``cpu(0)``);
    - an exception from the dataset or ``batchify_fn`` is raised as the same
      object, with its own traceback and a note naming the sample and thread
      (Gluon's process pool raises a copy, chained to a ``RemoteTraceback``);
    - ``timeout`` applies with any ``num_workers``; on expiry it raises
      ``multiprocessing.TimeoutError``, as Gluon's pool does;
    - ``prefetch`` (default ``2 * num_workers``, at least 1) batches are
      prepared ahead; ``auto_reload=True`` starts the next epoch's loading as
      soon as one ends;
    - starting a new iteration ends the one in progress (the threads are
      kept across epochs); ``close()`` (or ``with``) stops them at once.
    """

    def __init__(self, dataset, batch_size=None, shuffle=False, sampler=None,
                 last_batch=None, batch_sampler=None, batchify_fn=None,
                 num_workers=0, pin_memory=False, pin_device_id=0,
                 prefetch=None, thread_pool=False, timeout=120, auto_reload=False):
        # Gluon's checks, in Gluon's order, with its exception types and messages.
        assert timeout > 0, f"timeout must be positive, given {timeout}"
        if batch_sampler is None:
            if batch_size is None:
                raise ValueError("batch_size must be specified unless batch_sampler is specified")
            if sampler is None:
                if shuffle:
                    sampler = _gluon_data.RandomSampler(len(dataset))
                else:
                    sampler = _gluon_data.SequentialSampler(len(dataset))
            elif shuffle:
                raise ValueError("shuffle must not be specified if sampler is specified")
            batch_sampler = _gluon_data.BatchSampler(sampler, batch_size, last_batch if last_batch else "keep")
        elif batch_size is not None or shuffle or sampler is not None or last_batch is not None:
            raise ValueError("batch_size, shuffle, sampler and last_batch must not be specified if "
                             "batch_sampler is specified.")
        # Gluon's attribute names: code written for Gluon's loader reads them.
        self._dataset = dataset
        self._pin_memory = pin_memory
        self._pin_device_id = pin_device_id
        self._thread_pool = thread_pool
        self._timeout = timeout
        self._batch_sampler = batch_sampler
        self._num_workers = num_workers if num_workers >= 0 else 0
        self._worker_pool = None
        self._prefetch = max(0, int(prefetch) if prefetch is not None else 2 * self._num_workers)
        self._batchify_fn = _default_batchify_fn if batchify_fn is None else batchify_fn
        self._loader = None   # made by the first refresh(): no thread starts before an iteration
        self.auto_reload = auto_reload
        self._iter = None
        if self.auto_reload:
            self.refresh()

    def _make_loader(self):
        threads = max(self._num_workers, 1)
        dataset = self._dataset
        if _holds_reader(dataset):
            dataset = _ReaderPerThread(dataset)
        return Loader(dataset, batch_sampler=_Batches(self._batch_sampler), collate=self._batchify_fn,
                      workers=threads, depth=max(self._prefetch, 1), timeout=self._timeout,
                      device=mx.cpu_pinned(self._pin_device_id) if self._pin_memory else None,
                      name="gluon-DataLoader")

    def __iter__(self):
        if self._iter is None:
            self.refresh()
        epoch = self._iter
        self._iter = None   # a prefetched epoch is used once
        while True:
            try:
                batch = next(epoch)
            except StopIteration:
                break
            except TimeoutError as exc:
                raise multiprocessing.TimeoutError(
                    f"Worker timed out after {self._timeout} seconds") from exc
            yield batch
        if self._iter is None and self.auto_reload:
            self.refresh()

    def __len__(self):
        return len(self._batch_sampler)

    def refresh(self):
        """Starts loading the next epoch now (Gluon's prefetch of an epoch)."""
        if self._loader is None:
            self._loader = self._make_loader()
        self._iter = iter(self._loader)

    def clean(self):
        """Drops the prefetched epoch: loading starts at the next iteration."""
        self._iter = None

    def close(self):
        """Stops the threads and frees the buffers (idempotent)."""
        self._iter = None
        if self._loader is not None:
            self._loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        pass   # Gluon's terminates its process pool; the Loader goes with this object
