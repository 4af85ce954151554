"""The benchmark's peer loaders (bench/_peers.py: SPDL, torchdata.nodes, Grain) are installed
in the environment the main job uses (the torch one, tests/venvs.sh), and each row hands out the
batches a plain loop makes, in order, epoch after epoch: the rows compare loaders doing the
same work (SPEC §7; issue 25 item 1). A peer the environment lacks fails here, so the main job
cannot print "not installed" where the package index has it."""
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("torch")   # the peers are installed with torch, in the torch environment (tests/venvs.sh)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import _peers as P  # noqa: E402

pytestmark = pytest.mark.full  # the long tier (tests/run.sh --full)


class Squares:
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return np.full((2, 3), i * i, np.float32), i


def collate(samples):
    return np.stack([s[0] for s in samples]), np.array([s[1] for s in samples])


def test_every_peer_is_installed():
    _rows, missing = P.rows(Squares(), 4, collate)
    assert not missing, missing


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", P.PEERS)
def test_a_peer_row_gives_the_plain_loops_batches_for_two_epochs(name):
    ds = Squares()
    rows, missing = P.rows(ds, 4, collate)
    assert name in rows, missing.get(name)
    loader, closer = rows[name]()
    expected = [collate([ds[i] for i in range(k, k + 4)]) for k in range(0, 20, 4)]
    try:
        for _epoch in range(2):
            got = list(loader)
            assert len(got) == len(expected)
            for (x, y), (ex, ey) in zip(got, expected):
                np.testing.assert_array_equal(np.asarray(x), ex)
                np.testing.assert_array_equal(np.asarray(y), ey)
    finally:
        if closer is not None:
            closer()
