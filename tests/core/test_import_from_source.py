"""Importing the package from a folder where its compiled core is not built (a checkout run
from its root after `pip install .`) says so, and what to do, instead of failing as a circular
import (SPEC §4: an error that says what is wrong)."""
import importlib.machinery
import os
import shutil
import subprocess
import sys

import pytest

import prefetch


@pytest.mark.timeout(60)
def test_importing_the_source_folder_says_it_is_not_built(tmp_path):
    src = os.path.dirname(prefetch.__file__)
    shutil.copytree(src, tmp_path / "prefetch", ignore=shutil.ignore_patterns(
        "__pycache__", *("*" + s for s in importlib.machinery.EXTENSION_SUFFIXES)))
    r = subprocess.run([sys.executable, "-c", "import prefetch"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=50, env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: you are importing prefetch from its source folder"), r.stderr
    assert str(tmp_path / "prefetch") in last and "build in place" in last and "another folder" in last, last
    assert "circular" not in r.stderr, r.stderr
