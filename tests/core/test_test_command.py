"""The test command's tiers (tests/run.sh): a tier or flag it does not know is an error that
names the ones it knows, before anything is built or installed (SPEC §4's rule for bad input,
applied to the README's command)."""
import os
import shutil
import subprocess

import pytest

RUN_SH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run.sh")


@pytest.mark.skipif(shutil.which("bash") is None or not os.path.exists(RUN_SH), reason="needs bash and tests/run.sh")
@pytest.mark.parametrize("flag", ["--ful", "--fast", "--long", "full"])
def test_a_misspelt_tier_is_an_error_naming_the_tiers(tmp_path, flag):
    r = subprocess.run(["bash", RUN_SH, flag], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PREFETCH_ENVS": str(tmp_path / "envs"), "CI": ""})
    assert r.returncode == 2, r.stderr
    assert f"unknown tier or flag '{flag}'" in r.stderr and "--full" in r.stderr and "--matrix" in r.stderr, r.stderr
    assert not (tmp_path / "envs").exists()   # nothing made
