"""The public API and the compiled core's stubs (prefetch/_core.pyi) type-check
under mypy --strict, and the stubs name what the compiled module has."""
import pathlib
import subprocess
import sys

import pytest

import prefetch._core as core

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_mypy_strict_passes():
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                        "--cache-dir", "/dev/null"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_stub_names_exist_in_compiled_module():
    stub = (ROOT / "prefetch" / "_core.pyi").read_text()
    names = [line.split()[1].split("(")[0].rstrip(":") for line in stub.splitlines()
             if line.startswith(("def ", "class "))]
    assert names and all(hasattr(core, n) for n in names), [n for n in names if not hasattr(core, n)]


USER_SNIPPET = '''
from prefetch import Prefetcher

def batches() -> list[tuple[int, str]]:
    return [(1, "a")]

def main() -> None:
    with Prefetcher(batches(), depth=2) as p:
        for number, text in p:
            good: int = number
            bad: int = text
'''


@pytest.mark.full
def test_prefetcher_is_generic_for_a_user(tmp_path):
    """Iterating a Prefetcher over an iterable of T yields T to a type checker:
    mypy --strict accepts the int and rejects the str assigned to an int."""
    snippet = tmp_path / "user.py"
    snippet.write_text(USER_SNIPPET)
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--cache-dir", "/dev/null", str(snippet)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "user.py:11" in errors[0] and '"str"' in errors[0], r.stdout + r.stderr
