"""The public API and the compiled core's stubs (prefetch/_ring.pyi) type-check
under mypy --strict, and the stubs name what the compiled module has."""
import pathlib
import subprocess
import sys

import prefetch._ring as ring

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_mypy_strict_passes():
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                        "--cache-dir", "/dev/null"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_stub_names_exist_in_compiled_module():
    stub = (ROOT / "prefetch" / "_ring.pyi").read_text()
    names = [line.split()[1].split("(")[0].rstrip(":") for line in stub.splitlines()
             if line.startswith(("def ", "class "))]
    assert names and all(hasattr(ring, n) for n in names), [n for n in names if not hasattr(ring, n)]
