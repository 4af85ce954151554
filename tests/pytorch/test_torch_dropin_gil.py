"""The GIL warning through the torch drop-in kept on threads (loading="threads";
"auto" hands the loading to torch's processes: test_torch_dropin_processes.py):
one GILBoundWarning per DataLoader, over epochs with or without persistent
workers, and its remedy names torch's own process DataLoader wrapped in
prefetch.Prefetcher (the core's text names no framework). The gauge's meter is scripted (threads waiting for the GIL), so the
outcome is the test's, whatever else the machine runs; the gauge's own decisions
are tests/core/test_loader_gil.py's."""
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("torch")   # the torch environment's (tests/run.sh)

from prefetch import GILBoundWarning  # noqa: E402
from prefetch.torch import DataLoader  # noqa: E402

EPOCHS = 12


class Sleeps:
    """dataset[i] waits 2 ms without the GIL: both threads are inside it about all the time."""

    def __len__(self):
        return 160

    def __getitem__(self, i):
        time.sleep(0.002)
        return np.full(2, i)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_gil_bound_dataset_warns_once_per_dataloader_naming_torchs_process_loader(gil_bound, persistent):
    dl = DataLoader(Sleeps(), batch_size=4, num_workers=2, persistent_workers=persistent, loading="threads")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(EPOCHS):
            got = [b[:, 0].tolist() for b in dl]
            assert sum(got, []) == list(range(160))
    dl.close()
    notes = [w for w in caught if issubclass(w.category, GILBoundWarning)]
    assert len(notes) == 1, [str(w.message) for w in notes]
    text = str(notes[0].message)
    assert "torch.utils.data.DataLoader(dataset, num_workers=N) (processes), wrapped in prefetch.Prefetcher" in text
