"""The thread loaders a user evaluating thread-based loading would try, each set up as its own
documentation recommends for a map-style dataset, batched and collated the same way as ours.

    SPDL 0.8          spdl.dataloader.DataLoader(sampler indices, preprocessor=dataset.__getitem__,
                      batch_size=B, aggregator=collate, num_threads=W, output_order="input",
                      buffer_size=4): SPDL's DataLoader-style front of its pipeline (source ->
                      pipe(load, concurrency=W) -> aggregate(B) -> pipe(collate) -> sink), which
                      builds one pipeline per epoch. (A pipeline reused across epochs through
                      add_source(..., continuous=True) keeps loading while the consumer is
                      elsewhere, so in a benchmark that interleaves rows it is timed on a
                      backlog of more than an epoch and takes CPU from the rows being timed.)
    torchdata.nodes   SamplerWrapper(SequentialSampler) -> Batcher(B) -> ParallelMapper(map and
    0.11              collate a batch of indices, num_workers=W, method="thread", in_order=True)
                      -> Prefetcher(prefetch_factor=2 W) -> Loader: the "Migrating to
                      torchdata.nodes from torch.utils.data" recipe, on threads.
    Grain 0.2         grain.MapDataset.source(dataset).batch(B, batch_fn=collate)
                      .to_iter_dataset(grain.ReadOptions(num_threads=W, prefetch_buffer_size=4)):
                      the Dataset API's random-access chain, turned into an iterable late, read
                      by W threads; one iter() per epoch.

All three run in order (the sampler's order), as ours does. A peer that does not import is a
row that says "not installed" (with the pip command); the other rows run.
"""
from __future__ import annotations

import contextlib
import io
import logging

SPDL = "SPDL DataLoader(num_threads=2)"
NODES = 'torchdata.nodes ParallelMapper(method="thread", 2)'
GRAIN = "Grain to_iter_dataset(num_threads=2)"
PEERS = (SPDL, NODES, GRAIN)
INSTALL = {SPDL: "pip install spdl", NODES: "pip install torchdata", GRAIN: "pip install grain"}


def _quiet_import(name):
    """Import a peer without its import-time chatter (Grain logs a missing jax profiler)."""
    import importlib
    log = logging.getLogger("absl")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return importlib.import_module(name)
    finally:
        log.setLevel(old)


def _spdl(ds, batch, workers, collate):
    sd = _quiet_import("spdl.dataloader")
    loader = sd.DataLoader(range(len(ds)), preprocessor=ds.__getitem__, batch_size=batch, aggregator=collate,
                           num_threads=workers, output_order="input", buffer_size=4)
    return loader, None   # each `for` builds, runs and stops one epoch's pipeline


class _MapAndCollate:
    """The migration guide's map-and-collate step: a batch of indices to a collated batch."""

    def __init__(self, ds, collate):
        self.ds, self.collate = ds, collate

    def __call__(self, keys):
        return self.collate([self.ds[i] for i in keys])


def _nodes(ds, batch, workers, collate):
    tn = _quiet_import("torchdata.nodes")
    from torch.utils.data import SequentialSampler
    node = tn.SamplerWrapper(SequentialSampler(ds))
    node = tn.Batcher(node, batch_size=batch, drop_last=False)
    node = tn.ParallelMapper(node, map_fn=_MapAndCollate(ds, collate), num_workers=workers,
                             method="thread", in_order=True)
    node = tn.Prefetcher(node, prefetch_factor=2 * workers)
    return tn.Loader(node), None


def _grain(ds, batch, workers, collate):
    grain = _quiet_import("grain")
    it = (grain.MapDataset.source(ds)
          .batch(batch, batch_fn=collate)
          .to_iter_dataset(grain.ReadOptions(num_threads=workers, prefetch_buffer_size=4)))
    return it, None


_MAKE = {SPDL: (_spdl, "spdl.pipeline"), NODES: (_nodes, "torchdata.nodes"), GRAIN: (_grain, "grain")}


def rows(ds, batch, collate, workers=2):
    """name -> make() returning (iterable of epochs, closer or None), and name -> why not installed."""
    out, missing = {}, {}
    for name, (make, module) in _MAKE.items():
        try:
            _quiet_import(module)
            if name == NODES:
                _quiet_import("torch")
        except Exception as e:  # noqa: BLE001 - ImportError, or a peer failing at import on this platform
            missing[name] = f"not installed ({INSTALL[name]}; {type(e).__name__}: {str(e)[:60]})"
            continue
        out[name] = (lambda make=make: make(ds, batch, workers, collate))
    return out, missing


def prefetch_loader(ds, batch, workers):
    """make() for a prefetch.Loader row: (the loader, its close)."""
    import prefetch

    def make():
        ld = prefetch.Loader(ds, batch_size=batch, workers=workers)
        return ld, ld.close
    return make
