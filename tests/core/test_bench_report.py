"""What the benchmark's report leads with and counts (bench/run.py, bench/bench_loader.py;
issue 35 item 7): the first line's comparison is with a loader a user would pick instead,
never prefetch around a thread pool; the GILBoundWarning target counts every section that ran,
but those whose subject the warning is."""
import os
import pathlib
import sys
from types import SimpleNamespace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
_env = dict(os.environ)
import _stats as S  # noqa: E402
import bench_loader as L  # noqa: E402
import run  # noqa: E402

os.environ.clear()
os.environ.update(_env)   # run.py sets OMP_NUM_THREADS for the benchmark's process, not the tests'


def test_the_fastest_other_loader_is_never_prefetch_around_a_thread_pool():
    rows = {L.THREAD_MAP: [9.0] * 6, L.PLAIN: [3.0] * 6, "SPDL DataLoader(num_threads=2)": [5.0] * 6,
            L.LOADER2: [10.0] * 6, L.TORCH_OURS: [11.0] * 6}
    assert L.best_other(rows) == "SPDL DataLoader(num_threads=2)"


MODS = {"loader": SimpleNamespace(TITLE="Image pipeline: decode"),
        "loader_mx": SimpleNamespace(TITLE="Image pipeline on MXNet: Gluon"),
        "gil": SimpleNamespace(TITLE="GIL-bound dataset: pure Python", GIL_WARNINGS=True)}


def test_the_warning_count_covers_every_section_that_ran_but_those_about_the_gil():
    results = {"loader": {"gil_warnings": [], "others_cores": 0.1},
               "loader_mx": {"gil_warnings": ["loader 'x': its 2 threads ran ..."], "others_cores": 0.1},
               "gil": {"gil_warnings": ["expected", "expected"], "others_cores": 0.1}}
    [v] = run._gil_verdict(results, MODS)
    assert v.status == S.MISSED
    assert v.measured == "1 warning(s) (Image pipeline on MXNet: 1)"
    assert "2 of 3 sections" in v.target and v.note.startswith("first: loader 'x'")


def test_no_warning_meets_the_target_and_a_skipped_section_is_not_counted():
    results = {"loader": {"gil_warnings": [], "others_cores": 0.1},
               "loader_mx": {"skipped": "mxnet is not installed", "gil_warnings": []},
               "gil": {"gil_warnings": ["expected"], "others_cores": 0.1}}
    [v] = run._gil_verdict(results, MODS)
    assert (v.status, v.measured) == (S.MET, "0 warning(s)")
    assert run._gil_verdict({"gil": results["gil"]}, MODS) == []
