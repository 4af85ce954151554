"""The footprint section's repetitions (bench/bench_footprint.py run; issue 36, SPEC §7): those
added while a verdict's interval straddles its target run the rows that verdict compares, and
every ratio pairs the two rows' results of the same repetition. Rows are scripted: no loader
runs, no timing."""
import itertools
import pathlib
import sys
import types

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import _peers as P  # noqa: E402
import _stats as S  # noqa: E402
import bench_footprint as F  # noqa: E402

REPS, MAX_REPS = 6, 9


pytestmark = pytest.mark.full  # the long tier (tests/run.sh --full)


def _cfg():
    return {"reps": REPS, "max_reps": MAX_REPS, "quick": False, "extra_reps": REPS, "records": 10,
            "epochs": 1, "lock_records": 10, "timeout_s": 10,
            "validate": {"train": 10, "eval": 10, "epochs": 1, "step_s": 0.0}}


@pytest.fixture
def scripted(monkeypatch):
    """Every verdict met by a wide margin but "ahead of every thread peer": torchdata.nodes
    loads 0.9 and 1.1 x the Loader's batches/s in turn, so that interval straddles 1 for good;
    SPDL and Grain load half as fast as the Loader."""
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))   # run() needs only its import
    runs = []
    nodes = itertools.cycle([900.0, 1100.0])
    first = {F.FS2: 1.0, F.FORK2: 0.1, F.FORK4: 0.1, F.FS4: 1.0}
    bps = {F.FORK2: 100.0, F.LOADER2: 1000.0, P.NODES: None}

    def epoch_row(row, cfg):
        runs.append(row)
        rate = next(nodes) if row == P.NODES else bps.get(row, 500.0)
        return {"peak": 2.0, "growth": 1.0, "dataset": 100.0, "first_s": first.get(row, 0.001), "bps": rate,
                "later_first_s": [], "processes": 1, "samples": 1}

    def run_tree(cmd, timeout_s):
        mode, row = cmd[3], cmd[4]
        if mode == "lock":
            return {"batches": 1}, []
        return {"total_s": 1.0 if row in (F.DROPIN2, F.LOADER2) else 10.0, "eval_s": [0.01]}, []

    monkeypatch.setattr(F, "_epoch_row", epoch_row)
    monkeypatch.setattr(F, "run_tree", run_tree)
    return runs


def test_added_repetitions_run_only_the_rows_of_the_open_verdict(scripted):
    out = F.run(_cfg(), lambda _msg: None)
    added = scripted[len(F.ROWS) * REPS:]
    assert sorted(set(added)) == sorted({F.LOADER2, P.NODES})   # not the peers already behind
    assert len(added) == (MAX_REPS - REPS) * 2
    res = out["data"]["results"]
    assert len(res[F.LOADER2]) == MAX_REPS and len(res[P.NODES]) == MAX_REPS
    assert len(res[F.PLAIN]) == REPS and len(res[F.FORK2]) == REPS and len(res[P.SPDL]) == REPS
    still_open = [v for v in out["verdicts"] if v.status != S.MET]
    assert len(still_open) == 1 and "ahead of every thread peer" in still_open[0].target
    assert still_open[0].status == S.INCONCLUSIVE


def test_ratios_pair_results_of_the_same_repetition():
    xs = [{"rep": r, "v": 10.0 * (r + 1)} for r in range(4)]
    ys = [{"rep": 0, "v": 1.0}, {"rep": 2, "error": "failed"}, {"rep": 3, "v": 4.0}]
    assert F._paired(xs, ys, lambda x, y: x["v"] / y["v"]) == [10.0, 10.0]
