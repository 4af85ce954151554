"""``prefetch.mx.DataLoader``: Gluon's ``DataLoader`` (MXNet 1.9.1) on threads.

A subclass of ``mx.gluon.data.DataLoader`` (so code that checks for one, such
as Gluon's Estimator, takes it) whose constructor never calls Gluon's: that
one starts a process pool. It validates its arguments as Gluon's does,
builds Gluon's own samplers, and loads with a ``prefetch.Loader``.

Threading contract: ``_per_thread`` runs on loader threads (once each);
everything else on the consumer's thread, and a dropped pass's ``finally``
wherever its generator is collected.
"""
import base64
import dataclasses
import gc
import itertools
import multiprocessing
import os
import threading
import types

import numpy as np

from prefetch._framework import (
    Choice,
    ClosedError,
    Closing,
    Cut,
    FrameworkLoader,
    Identity,
    ProcessEpoch,
    Stats,
    check_batch_size,
    check_loading,
    check_num_workers,
    for_processes,
    order_part,
    replica,
    say_handover,
    start_method,
    unpicklable,
)
from prefetch.mx._mxnet import mx

_gluon_data = mx.gluon.data
_default_batchify_fn = _gluon_data.dataloader.default_batchify_fn
# dtypes both nd.array keeps and nd.from_numpy wraps without a copy (DLPack)
_WRAPPABLE = frozenset(("int32", "int64", "uint8", "float16", "float32", "float64"))


def _host_batchify(data):
    """Gluon's ``default_batchify_fn`` with the NDArrays left to the consumer:
    numeric samples are stacked by numpy on the loader thread (the same values
    and dtypes as ``nd.array(np.asarray(data))``), and wrapped as NDArrays
    without a copy when handed out (``_to_nd``), instead of being copied into
    an NDArray here and again by the Loader. NDArray samples, numpy-mode
    arrays and what nd.array would convert or refuse go through Gluon's own."""
    if isinstance(data[0], tuple):
        return [_host_batchify(field) for field in zip(*data)]
    if isinstance(data[0], mx.nd.NDArray) or mx.util.is_np_array():
        return _default_batchify_fn(data)
    stacked = np.asarray(data)
    if stacked.dtype.name not in _WRAPPABLE:
        return _default_batchify_fn(data)   # Gluon's own conversion, or its error
    return stacked


def _to_nd(batch):
    """What _host_batchify made, as Gluon's default gives it: lists of NDArrays."""
    if isinstance(batch, np.ndarray):
        return mx.nd.from_numpy(np.ascontiguousarray(batch), zero_copy=True)
    if isinstance(batch, list):
        return [_to_nd(field) for field in batch]
    return batch


_Reader = mx.recordio.MXRecordIO
# Never a reader, nothing to look into.
_ATOMS = frozenset((str, bytes, bytearray, int, float, complex, bool, type(None)))
_OPAQUE = (_Reader, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           np.ndarray, np.generic, mx.nd.NDArray)


def _held(obj):
    """What to ask ``gc.get_referents`` for what ``obj`` holds: a list, tuple
    or dict, or an object with attributes, itself; None for a reader and what
    holds nothing to look into. Not ``obj.__dict__``: reading it gives the
    object a dict of its own on CPython 3.11, and its attribute reads (in
    dataset[i], on threads and in worker processes forked later) go slower."""
    if isinstance(obj, (list, tuple, dict)) or not isinstance(obj, _OPAQUE) and type(obj).__dictoffset__:
        return obj
    return None


def _reader_paths(root):
    """The objects reachable from ``root`` (through lists, tuples, dicts and
    attributes) that are RecordIO readers or hold one: the path each loader
    thread copies to a reader of its own, as ``replica``'s ``along`` (by id,
    a reader with ``_fresh_reader``, a holder with None). Empty: none.

    It looks a level at a time through ``gc.get_referents`` (0.2 s for a
    million (path, label) tuples on a 2-core machine, where a walk of one
    object at a time takes 1.4 s); only where it met a reader does it go
    back over the levels for what holds one."""
    levels, paths, seen = [], {}, {id(root)}
    level = [root]
    while level:
        levels.append(level)   # keeps every id seen valid
        # A writer stays shared: reopening it truncates the file.
        paths.update((id(obj), _fresh_reader) for obj in level if isinstance(obj, _Reader) and obj.flag == "r")
        level = []
        for obj in gc.get_referents(*filter(None, map(_held, levels[-1]))):
            kind = type(obj)
            if kind is tuple:
                level.append(obj)   # not remembered: no cycle runs through tuples alone
            elif kind not in _ATOMS and id(obj) not in seen:
                seen.add(id(obj))
                level.append(obj)
    grew = bool(paths)
    while grew:   # deepest level first; again where a cycle or a shared object leads back up
        grew = False
        for obj in itertools.chain.from_iterable(reversed(levels)):
            held = _held(obj)
            if held is not None and id(obj) not in paths and any(id(x) in paths for x in gc.get_referents(held)):
                paths[id(obj)] = None
                grew = True
    return paths


def _fresh_reader(reader):
    """A reader of the same file with a handle of its own (Gluon's worker
    processes get theirs by unpickling; pickling closes the original)."""
    own = object.__new__(type(reader))
    own.__dict__.update(reader.__dict__)
    own.handle = mx.base.RecordIOHandle()
    own.is_open = False
    own.open()
    return own


# -- the batch sampler, its order and its state ----------------------------------

class _Batches:
    """Gluon's batch sampler as the Loader sees it: an iterable of index
    lists with no ``set_epoch`` (the Loader's epochs are not Gluon's), whose
    first draw (``RandomSampler``'s shuffle, from numpy's global generator)
    is made on the consumer's thread as a pass starts, as Gluon's loader
    makes it. Its state, saved at each pass's start, is numpy's global
    generator and the samples a ``rollover`` sampler carries over (checked
    by ``_sampler_state``)."""

    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler
        self.processes = False   # Gluon's worker pool loads the passes that begin (refresh())
        self.skip = 0            # batches of the next pass handed out before a loaded state
        self.cut = None          # what the threads take of the pass begun

    def __iter__(self):
        keys = iter(self.batch_sampler)
        self.cut = Cut(itertools.chain(list(itertools.islice(keys, 1)), keys), self.processes, self.skip)
        self.skip = 0
        return self.cut

    # No __len__: a rollover sampler's varies with what it carries, and the
    # DataLoader checks a resumed state's batches itself.

    def state_dict(self):
        _, key, pos, has_gauss, gauss = np.random.get_state()
        rng = {"key": base64.b64encode(key.astype("<u4").tobytes()).decode("ascii"), "pos": int(pos),
               "has_gauss": int(has_gauss), "gauss": float(gauss)}
        carried = getattr(self.batch_sampler, "_prev", None)
        return {"numpy_rng": rng, "rollover": None if carried is None else [int(i) for i in carried]}

    def load_state_dict(self, state):
        rng, carried = _sampler_state(state)
        np.random.set_state(rng)
        if carried is not None and hasattr(self.batch_sampler, "_prev"):
            self.batch_sampler._prev = list(carried)


def _sampler_state(saved):
    """Numpy's generator state and a rollover's carried samples in ``saved``
    (the state's sampler part, ``_Batches.state_dict()``'s); ValueError for
    one truncated or edited."""
    try:
        rng = saved["numpy_rng"]
        key = base64.b64decode(rng["key"], validate=True)
        if len(key) != 624 * 4 or not isinstance(rng["pos"], int) or not 0 <= rng["pos"] <= 624:
            raise ValueError("numpy_rng")
        if not isinstance(rng["has_gauss"], int) or not isinstance(rng["gauss"], float):
            raise ValueError("numpy_rng")
        carried = saved["rollover"]
        if carried is not None and not all(isinstance(i, int) for i in carried):
            raise ValueError("rollover")
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"state has a bad or missing sampler state (truncated or edited?): {exc!r} "
                         f"in {saved!r:.200}") from None
    return ("MT19937", np.frombuffer(key, "<u4"), rng["pos"], rng["has_gauss"], rng["gauss"]), carried


GLUON_LOADER = "mxnet.gluon.data.DataLoader"   # the framework part's name in the resume state


class DataLoader(_gluon_data.DataLoader, Closing):
    """``mx.gluon.data.DataLoader`` with the same signature, samplers and
    batches, loading on ``num_workers`` threads (one when it is 0).

    On threads nothing is pickled; ``dataset[i]`` must allow being called
    by several threads at once. With ``num_workers > 0`` each thread loads
    from a shallow copy of its own (a RecordIO reader through a reader of its
    own), as each worker process holds a copy. Each iteration is a pass of its
    own, as in Gluon; the threads are kept across passes, and ``close()`` (or
    ``with``) stops them at once. A dataset's exception is raised as itself,
    with a note naming the sample and the thread. What differs from Gluon's:
    docs/dropins.md.

    ``loading`` (keyword only, not Gluon's): ``"threads"``, ``"processes"``
    (Gluon's own worker pool, as ``thread_pool=False``), or ``"auto"`` (the
    default: threads, handing the rest of a pass, and every later one, to
    Gluon's worker pool, where it can run them, once the threads measure
    ``dataset[i]`` holding the GIL).
    ValueError for any other value.
    """

    def __init__(self, dataset, batch_size=None, shuffle=False, sampler=None,
                 last_batch=None, batch_sampler=None, batchify_fn=None,
                 num_workers=0, pin_memory=False, pin_device_id=0,
                 prefetch=None, thread_pool=False, timeout=120, auto_reload=False, *, loading="auto"):
        # Gluon's checks, in Gluon's order, with its exception types and messages;
        # and those Gluon leaves to its iterator (a ZeroDivisionError, a bare
        # TypeError comparing num_workers with 0), here where they are given.
        self.loading = check_loading(loading)
        check_num_workers(num_workers)
        assert timeout > 0, f"timeout must be positive, given {timeout}"
        if batch_sampler is None:
            if batch_size is None:
                raise ValueError("batch_size must be specified unless batch_sampler is specified")
            check_batch_size(batch_size, alone=False)
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
        self._said_batch_size = batch_size   # what the resume state records (None: a batch_sampler's)
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
        self._given_batchify = batchify_fn   # Gluon's pool's (None: its default for processes)
        self._choice = Choice(loading)   # where the passes load (_hand_over), decided once
        self._gluon = None          # Gluon's own DataLoader (its worker pool), once that loads
        self._process_pass = None   # the pass that pool finishes or loads, as state_dict()/stats() read it
        # Gluon's default on the host: one copy fewer per batch (pinned batches go Gluon's way)
        self._on_host = self._batchify_fn is _default_batchify_fn and not pin_memory
        paths = _reader_paths(dataset)
        # num_workers=0: Gluon loads from the dataset itself (its readers are still the thread's)
        kinds = (_gluon_data.Dataset,) if self._num_workers > 0 else ()
        # A loader thread's dataset: its replica with readers of its own (a reader's seek-then-read
        # is not atomic, so threads cannot share one) and, with `kinds`, a copy of each Gluon dataset.
        self._per_thread = (lambda data, worker_id: replica(data, kinds, paths)) if paths or kinds else None
        # Each pass (each iteration, as in Gluon) runs on a Loader that no
        # other pass holds: one whose pass ended or was dropped, or a new one.
        self._lock = threading.Lock()
        self._loaders = []        # every Loader made (close() closes them)
        self._idle = []           # those no pass holds
        self._busy = set()        # ids of those a pass holds
        self._latest = None       # the Loader of the pass started last (state_dict())
        self._next = None         # a Loader holding a loaded state, for the next pass
        self._closed = False
        self._seed = int.from_bytes(os.urandom(16), "little")   # of sample_rng(), shared by the passes
        self._epoch = 0           # the number of the next pass (sample_rng()'s epoch)
        self.auto_reload = auto_reload
        self._iter = None         # a pass started ahead: (loader, its epoch, its number)
        if self.auto_reload:
            self.refresh()

    def _for_next(self):
        """The Loader for the next pass: the one holding a loaded state, one left idle, or a new one."""
        loader, self._next = self._next, None
        if loader is not None:
            return loader
        with self._lock:
            if self._closed:
                raise ClosedError("this DataLoader is closed")
            if self._idle:
                return self._idle.pop()
        loader = FrameworkLoader(self._dataset, per_thread=self._per_thread,
                                 remedy="Gluon's own DataLoader(dataset, num_workers=N)",
                                 identity=self._identity(), batch_sampler=_Batches(self._batch_sampler),
                                 collate=_host_batchify if self._on_host else self._batchify_fn,
                                 workers=max(self._num_workers, 1), depth=max(self._prefetch, 1),
                                 timeout=self._timeout,
                                 device=mx.cpu_pinned(self._pin_device_id) if self._pin_memory else None,
                                 on_notice=self._choice.on_notice(self._num_workers > 0),
                                 name="gluon-DataLoader")
        with self._lock:
            self._loaders.append(loader)
            closed = self._closed
        if closed:
            loader.close()
            raise ClosedError("this DataLoader is closed")
        return loader

    def _release(self, loader, epoch):
        """The pass on ``loader`` ended or was dropped: its loading stops and
        the loader serves a later pass."""
        epoch.stop()
        with self._lock:
            self._busy.discard(id(loader))
            self._idle.append(loader)

    def __iter__(self):
        if self._iter is None:
            self.refresh()
        loader, epoch, _ = self._iter
        self._iter = None   # a prefetched pass is used once
        with self._lock:
            self._busy.add(id(loader))
        handed = loader.batch_sampler.cut.skip   # batches of the pass handed out (before a loaded state too)
        rest = self._hand_over(loader, handed) if self._choice.processes else None
        try:
            while True:
                try:
                    batch = next(epoch)
                except StopIteration:
                    break
                except TimeoutError as exc:
                    raise multiprocessing.TimeoutError(
                        f"Worker timed out after {self._timeout} seconds") from exc
                handed += 1
                if rest is not None:
                    self._process_pass.handed = handed
                elif self._choice.notices and self._choice.decide(self._why_not_processes, self._say):
                    # The threads measured dataset[i] holding the GIL: Gluon's worker pool
                    # loads the rest of the pass, and every later one; the one warning said so.
                    rest = self._hand_over(loader, handed)
                yield _to_nd(batch) if self._on_host else batch
            if rest is not None:   # the threads' part is over: Gluon's workers go on
                process_pass = self._process_pass
                for batch in rest:
                    handed += 1
                    process_pass.handed = handed
                    yield batch
                process_pass.finished = True
        finally:
            self._release(loader, epoch)
        if self._iter is None and self.auto_reload:
            self.refresh()

    def _why_not_processes(self):
        """Why Gluon's worker pool cannot run this dataset; None where it can."""
        reason = unpicklable("batchify_fn", (self._given_batchify,),
                             "Gluon's worker pool, which sends it with each batch,")
        method = start_method()
        if reason is None and method != "fork":
            reason = unpicklable("dataset", (self._dataset,), f"the {method!r} start method")
        return reason

    def _say(self, note, reason):
        """The one warning about the GIL notice ``note``, at the user's line."""
        say_handover(note, reason, framework="Gluon", loader=GLUON_LOADER, workers=self._num_workers,
                     method=start_method(), same="the same batches, order and batchify_fn")

    def _hand_over(self, loader, handed):
        """The index lists of the pass begun that no thread opened go to
        Gluon's worker pool (a Gluon ``DataLoader(thread_pool=False)``, made
        the first time), once the threads have finished theirs: no loader
        thread is then inside MXNet (a batchify_fn's NDArrays) while Gluon
        forks its pool, which could leave a lock of MXNet's engine held in a
        worker for ever (``last_batch`` is the user's batch sampler's, read on this side)."""
        self._process_pass = ProcessEpoch(loader, handed)
        return self._gluon_pass(loader.batch_sampler.cut.rest())

    def _gluon_pass(self, rest):
        """Gluon's pool's batches of ``rest``, its pool made as the first is asked for."""
        if self._gluon is None:
            self._gluon = _gluon_data.DataLoader(
                for_processes(self._dataset, (_gluon_data.Dataset,)), batch_sampler=[], batchify_fn=self._given_batchify,
                num_workers=self._num_workers, pin_memory=self._pin_memory, pin_device_id=self._pin_device_id,
                prefetch=self._prefetch, thread_pool=False, timeout=self._timeout)
        self._gluon._batch_sampler = rest   # what refresh() reads, as Gluon's DataLoader made it
        self._gluon.refresh()   # its workers load from now (Gluon's own start of a pass)
        yield from self._gluon

    def refresh(self):
        """Starts loading the next pass now (Gluon's prefetch of an epoch)."""
        pending, self._iter = self._iter, None
        if pending is not None:
            loader, _, number = pending   # started again, under the same number
        else:
            loader = self._for_next()
            number, self._epoch = self._epoch, self._epoch + 1
        loader.adopt_seed(self._seed)
        loader.set_epoch(number)   # a state loaded for this pass is kept
        loader.batch_sampler.processes = self._choice.processes   # the threads take none of it
        self._iter = (loader, iter(loader), number)
        self._latest = loader

    def clean(self):
        """Drops the prefetched pass: loading starts at the next iteration."""
        pending, self._iter = self._iter, None
        if pending is not None:
            self._epoch = pending[2]
            self._release(pending[0], pending[1])

    # -- resuming ---------------------------------------------------------------

    def _identity(self):
        """What its resume states are of; their Gluon part, what decides which batches a pass has."""
        sampler, batch_sampler = getattr(self._batch_sampler, "_sampler", None), self._batch_sampler
        return Identity(self._dataset, stream=False, batch_size=self._said_batch_size, sampler_state=True,
                        order=order_part(isinstance(sampler, _gluon_data.RandomSampler), sampler, batch_sampler),
                        framework={"name": GLUON_LOADER, "last_batch": getattr(batch_sampler, "_last_batch", None)},
                        owner="DataLoader")

    def state_dict(self):
        """Where the loader is: a small JSON-serialisable dict (docs/dropins.md),
        taken at any moment without pausing the threads. After a ``break``,
        where the loop stopped; between passes, the next pass's start."""
        with self._lock:
            loader = self._next
            if loader is None and self._iter is not None:
                loader = self._iter[0]
            if loader is None:
                # The pass started last, whether running, left by a break
                # (its state: where the consumer stopped) or ended (its
                # state: the next pass's start).
                loader = self._latest
        process_pass = self._process_pass
        if process_pass is not None and process_pass.source is loader:
            return process_pass.state_dict()
        if loader is not None:
            return loader.state_dict()
        # No pass yet: the first one's start.
        return self._identity().state(seed=self._seed, epoch=self._epoch,
                                      sampler=_Batches(self._batch_sampler).state_dict(), streams=None)

    def load_state_dict(self, state):
        """Continue where ``state`` (from ``state_dict()`` of a loader over the
        same data and batches) was taken: the next pass delivers the batches
        an uninterrupted run would have delivered next, and numpy's global
        generator is where it was at that pass's start (so the shuffle and the
        passes after it are the same). Call it before iterating or between passes.

        Raises
        ------
        ValueError
            For a state of another format or version, dataset length, batch
            size, ``last_batch`` or order (shuffled or not, the samplers'
            kinds), or one truncated or edited; nothing changes.
        prefetch.ClosedError
            Once the DataLoader is closed.
        RuntimeError
            While a pass is in progress.
        """
        batches = -1   # per pass: unknown, or varying (a rollover sampler's)
        if getattr(self._batch_sampler, "_last_batch", None) != "rollover":
            try:
                batches = len(self._batch_sampler)
            except (TypeError, ValueError):   # a bad last_batch raises at the end of the pass, as Gluon's
                pass
        identity = self._identity()
        resume, seed = identity.check(state, None, batches)
        _sampler_state(state["sampler"])
        _check_gluon_part(resume.framework, identity.framework)
        with self._lock:
            if self._closed:
                raise ClosedError("this DataLoader is closed: cannot load a state into it")
            if self._busy:
                raise RuntimeError("cannot load a state into this DataLoader while a pass over it is in "
                                   "progress; load it before iterating, or once the pass has ended")
        self.clean()   # a pass started ahead (auto_reload) stops: the state's pass comes next
        loader = self._for_next()
        try:
            loader.load_checked(resume, seed)   # checked once, above
            loader.batch_sampler.skip = state["batches"]   # the threads drop them; a hand-over, the rest
        except BaseException:
            with self._lock:
                self._idle.append(loader)
            raise
        self._seed, self._epoch, self._next = seed, resume.epoch, loader
        if self.auto_reload:
            self.refresh()

    def stats(self):
        """The ``prefetch.Stats`` of the pass begun last (``loading``: "threads"
        or Gluon's worker "processes"); all zero before the first pass."""
        loader = self._latest
        process_pass = self._process_pass
        if process_pass is not None and process_pass.source is loader:
            return process_pass.stats()
        if loader is None:
            return Stats()
        return dataclasses.replace(loader.stats(), loading="threads")

    # -- lifecycle ----------------------------------------------------------------

    def close(self):
        """Stops the threads and frees the buffers (idempotent)."""
        with self._lock:
            self._closed = True
            loaders, self._idle = list(self._loaders), []
        self._iter = self._next = None
        for loader in loaders:
            loader.close()
        pool = None if self._gluon is None else self._gluon._worker_pool
        if pool is not None:   # terminated and joined: no process is left
            self._gluon._worker_pool = None   # Gluon's __del__ has nothing left to end
            pool.terminate()
            pool.join()

    def __del__(self):
        pass   # Gluon's terminates its process pool; the Loaders go with this object


def _check_gluon_part(saved, own):
    if not isinstance(saved, dict) or sorted(saved) != sorted(own):
        raise ValueError(f"state has a bad Gluon part (truncated or edited?): {saved!r:.200}")
    if saved["last_batch"] != own["last_batch"]:
        raise ValueError(f"state was saved with last_batch={saved['last_batch']!r}; this DataLoader has "
                         f"last_batch={own['last_batch']!r}")
