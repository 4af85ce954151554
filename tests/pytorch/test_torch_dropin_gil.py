"""Issue 25 item 2 through the torch drop-in: a dataset[i] that holds the GIL gets one
GILBoundWarning per DataLoader, over epochs with or without persistent workers, and its
remedy names torch's own process DataLoader wrapped in prefetch.Prefetcher (the core's
text names no framework)."""
import os
import warnings

import pytest

pytest.importorskip("torch")   # the torch environment's (tests/run.sh)

from prefetch import GILBoundWarning  # noqa: E402
from prefetch.torch import DataLoader  # noqa: E402
from support import PurePython  # noqa: E402

EPOCHS = 12   # the warning comes within a few 50 ms windows of the first epoch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_gil_bound_dataset_warns_once_per_dataloader_naming_torchs_process_loader(monkeypatch, persistent):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    dl = DataLoader(PurePython(), batch_size=4, num_workers=2, persistent_workers=persistent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(EPOCHS):
            got = [b[0][:, 0].tolist() for b in dl]
            assert sum(got, []) == list(range(160))
    notes = [w for w in caught if issubclass(w.category, GILBoundWarning)]
    assert len(notes) == 1, [str(w.message) for w in notes]
    text = str(notes[0].message)
    assert "torch.utils.data.DataLoader(dataset, num_workers=N) (processes), wrapped in prefetch.Prefetcher" in text
