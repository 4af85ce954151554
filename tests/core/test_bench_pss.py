"""The benchmark's memory of a process tree (bench/_util.py tree_pss, bench/bench_footprint.py
run_tree; issue 36): a loader's worker processes and their children are counted, and a row's
processes never outlive it, however it ends. No timing thresholds."""
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import _util as U  # noqa: E402
import bench_footprint as F  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc")
pytestmark = [pytestmark, pytest.mark.full]  # the long tier (tests/run.sh --full)

MiB = 2**20

# A child holding 40 MiB (shared with the grandchild after the fork) that forks a grandchild
# writing 24 MiB of its own; once the grandchild says it has, the child prints both pids (with
# "exit": as JSON, then exits and leaves the grandchild running), then both sleep.
TREE = textwrap.dedent("""
    import json, os, sys, time
    mine = b"x" * (40 << 20)
    ready, written = os.pipe()
    pid = os.fork()
    if pid == 0:
        theirs = b"y" * (24 << 20)
        os.write(written, b"!")
        time.sleep(600)
        os._exit(0)
    os.read(ready, 1)
    if sys.argv[1:] == ["exit"]:
        print(json.dumps({"grandchild": pid}), flush=True)
        os._exit(0)
    print(os.getpid(), pid, flush=True)
    time.sleep(600)
""")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_tree_counts_a_grandchild_and_its_own_memory():
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        child, grandchild = map(int, p.stdout.readline().split())   # its 24 MiB written
        assert U.tree_pids(child)[:1] == [child] and grandchild in U.tree_pids(child)
        total, n = U.tree_pss(child)
        assert n == 2
        assert U.pss_bytes(grandchild) >= 24 * MiB   # its own pages, and half the shared ones
        assert total >= 62 * MiB                     # the shared 40 MiB counted once, not twice
        assert total <= U.pss_bytes(child) + U.pss_bytes(grandchild) + MiB
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        try:
            os.kill(grandchild, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_gone_process_has_no_memory():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert U.pss_bytes(p.pid) is None
    assert U.tree_pss(p.pid) == (0, 0)


def test_run_tree_leaves_no_process_behind():
    """The child exits and leaves a grandchild sleeping: run_tree kills it with the child's
    process group. Its samples cover the tree while it ran."""
    r, samples = F.run_tree([sys.executable, "-c", TREE, "exit"], timeout_s=30, sample_s=0.01)
    assert samples
    assert not _alive(r["grandchild"])   # run_tree waits for the group to be gone


def test_run_tree_kills_a_row_that_runs_too_long():
    """A row that would sleep past the test's own timeout is killed at run_tree's."""
    r, _ = F.run_tree([sys.executable, "-c", "import time; time.sleep(600)"], timeout_s=1, sample_s=0.05)
    assert r == {"error": "timed out after 1 s"}
