"""What the benchmark's report leads with and counts (bench/run.py, bench/bench_loader.py;
issue 35 item 7): the first line's comparison is with a loader a user would pick instead,
never prefetch around a thread pool; the GILBoundWarning target counts every section that ran,
but those whose subject the warning is."""
import os
import pathlib
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
_env = dict(os.environ)
import _stats as S  # noqa: E402
import bench_loader as L  # noqa: E402
import run  # noqa: E402

os.environ.clear()
os.environ.update(_env)   # run.py sets OMP_NUM_THREADS for the benchmark's process, not the tests'


pytestmark = pytest.mark.full  # the long tier (tests/run.sh --full)


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


def _head(status, median=1.35, lo=1.33, hi=1.37, other="Grain to_iter_dataset(num_threads=2)", busy=False):
    return S.Headline(L.LOADER2, f"{other}, the fastest other loader here", "on an image pipeline (JPEG decode, "
                      "crop, normalise; batches of 32; a GIL-free training step of half the load time)",
                      S.Interval(median, lo, hi, 9), verdict=S.Verdict("t", "m", status, busy=busy), name=other,
                      role="the fastest other loader", where="image pipeline", goal=L.GOAL)


@pytest.mark.parametrize("status", [S.MET, S.MISSED, S.INCONCLUSIVE, S.NOT_RESOLVED])
@pytest.mark.parametrize("other", ["Grain to_iter_dataset(num_threads=2)", "SPDL DataLoader(num_threads=2)",
                                   "torch DataLoader(num_workers=2, persistent_workers=True, pin_memory=False)"])
def test_the_first_line_says_who_won_by_how_much_against_what_and_whether_it_holds(status, other):
    line = _head(status, other=other, busy=status == S.MET).first_line(2)
    assert len(line) <= 160, line
    assert line.startswith(f"{L.LOADER2} beat ") and " by 1.35x" in line, line
    words = {S.MET: "holds (target >= 1.10x: met) (busy machine)", S.MISSED: "does not hold (target >= 1.10x: missed)",
             S.INCONCLUSIVE: "too close to call (target >= 1.10x)",
             S.NOT_RESOLVED: "provisional (quick run; target >= 1.10x)"}[status]
    assert line.endswith(f": {words}."), line
    assert other.split("(")[0] in line, line


def test_the_first_line_names_the_other_as_the_winner_when_ours_is_slower():
    line = _head(S.MISSED, median=0.80, lo=0.70, hi=0.90).first_line(2)
    assert line.startswith("Grain to_iter_dataset(num_threads=2) beat prefetch.Loader(workers=2)"), line
    assert " by 1.25x" in line and line.endswith("does not hold (target >= 1.10x: missed).") and len(line) <= 160, line


def test_the_report_leads_with_the_first_line_then_its_detail():
    results = {"loader": {"headline": _head(S.NOT_RESOLVED), "claims": ["2.45 [2.37, 2.56] x a plain loop"],
                          "verdicts": [], "tables": [], "others_cores": 0.0, "wall_s": 1.0, "gil_warnings": []}}
    env = {"cores": 2, "cpu": "cpu", "python": "3.11.7", "numpy": "2", "mxnet": None, "time_utc": "now"}
    first, detail = run._headline(results, ["loader"], env, quick=True)
    assert first == _head(S.NOT_RESOLVED).first_line(2) and len(first) <= 160
    assert detail.startswith(f"{L.LOADER2} loads 1.35 [1.33, 1.37] x the batches/s of Grain") and "a plain loop" in detail


def _quick_results():
    """A quick run's bench.json as the plot reads it: the four quick sections' data, made up."""
    import bench_loader_mx as LM
    import bench_loader_val as LV
    import bench_mx_engine as E
    reps = 9
    bps = {L.PLAIN: [4.0] * reps, L.LOADER2: [10.0] * reps, "Grain to_iter_dataset(num_threads=2)": [7.5] * reps}
    gluon = {L.PLAIN: [4.0] * reps, LM.GLUON: [6.0] * reps, LM.GLUON_THREADS: [7.0] * reps, LM.OURS: [8.0] * reps}
    us = {E.PLAIN: [10.0] * reps, E.COPY: [14.0] * reps, E.MXPF: [16.0] * reps, E.OURS1: [13.0] * reps,
          E.OURS4: [14.0] * reps}
    step = {"step = load/2": 0.05}
    sections = {
        "loader": {"title": L.TITLE, "data": {"batches_per_s": {"step = load/2": bps}, "steps_s": step,
                                               "ideal": {"step = load/2": 20.0},
                                               "best_other": {"step = load/2": "Grain to_iter_dataset(num_threads=2)"}},
                   "headline": {"ours": L.LOADER2}},
        "loader_val": {"title": LV.TITLE, "data": {"fraction_of_1_over_step": {LV.AFTER_EPOCH: [0.99] * reps,
                                                                                LV.AFTER_VAL: [0.98] * reps},
                                                    "step_s": 0.1}},
        "loader_mx": {"title": LM.TITLE, "data": {"batches_per_s": {"step = load/2": gluon}, "steps_s": step}},
        "mx_engine": {"title": E.TITLE, "data": {f"waits {E.SHAPES[0]}": {"us": us, "batches": 400}}},
        "loader_scaling": {"title": "Loader: scaling", "data": {"x": 1}},
    }
    return {"quick": True, "ran": list(sections), "sections": sections, "headline": "a first line",
            "env": {"time_utc": "now", "cpu": "cpu", "cores": 2, "python": "3.11", "numpy": "2", "mxnet": None}}


def test_a_quick_runs_plot_has_a_panel_for_every_quick_section_and_none_empty():
    import plot
    drawn, left = plot.panels(_quick_results())
    assert [s for s, _m, _d in drawn] == ["loader", "loader_val", "loader_mx", "mx_engine"]
    assert left == ["Loader: scaling"]   # no plot of its own: named in the title, no empty panel


def test_each_panels_target_line_is_its_tables_target():
    """The quick mx_engine table judges extra cost <= 1.00 x mx.io.PrefetchingIter's; its panel's
    target line is that one (it had drawn the full run's 1.10)."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import plot
    drawn, _ = plot.panels(_quick_results())
    targets = {}
    for s, mod, sec in drawn:
        fig, ax = plt.subplots()
        mod.plot(ax, sec["data"])
        targets[s] = [(line.get_label(), list(line.get_xdata()) + list(line.get_ydata())) for line in ax.lines
                      if line.get_label().startswith("target")]
        plt.close(fig)
    assert targets["mx_engine"] == [("target: 1.00 x mx.io.PrefetchingIter's extra cost", [0, 1, 1.0, 1.0])]
    assert targets["loader"][0][0] == "target: 1.10 x Grain to_iter_dataset(num_threads=2)"
    assert targets["loader"][0][1][:2] == [pytest.approx(1.10 * 7.5)] * 2
    assert targets["loader_mx"][0][1][:2] == [pytest.approx(1.10 * 7.0)] * 2
    assert targets["loader_val"][0][1][:2] == [0.95, 0.95]
