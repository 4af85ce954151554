"""prefetch.mx is typed (issue 9): its stub (prefetch/mx/__init__.pyi) type-checks
a user's code under mypy --strict and names what the package has."""
import inspect
import pathlib
import subprocess
import sys
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # mxnet 1.9.1 uses np.bool
    pytest.importorskip("mxnet")

import prefetch.mx as pmx  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB = ROOT / "prefetch" / "mx" / "__init__.pyi"

USER_SNIPPET = '''
from prefetch.mx import PrefetchingIter, patch, unpatch


def main(source: object) -> None:
    with PrefetchingIter(source, depth=2, timeout=5.0) as it:
        for batch in it:
            print(batch.data[0])
        produced: int = it.stats().produced
        closed: bool = it.closed
        pad: str = it.getpad()
    patch(depth=1)
    unpatch()
'''


def test_user_code_type_checks_under_mypy_strict(tmp_path):
    """mypy --strict accepts the calls and rejects the int assigned to a str (line 11)."""
    snippet = tmp_path / "user.py"
    snippet.write_text(USER_SNIPPET)
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--cache-dir", "/dev/null", str(snippet)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "user.py:11" in errors[0] and '"int"' in errors[0], r.stdout + r.stderr


def test_stub_names_what_the_package_has():
    stub = STUB.read_text()
    tops = [line.split()[1].split("(")[0].rstrip(":") for line in stub.splitlines()
            if line.startswith(("def ", "class "))]
    assert sorted(tops) == sorted(set(pmx.__all__) - {"ClosedError"})  # re-exported from prefetch
    missing, cls = [], None
    for line in stub.splitlines():
        if line.startswith("class "):
            cls = getattr(pmx, line.split()[1].split("(")[0].rstrip(":"))
        elif line.startswith("    def ") and not hasattr(cls, line.split()[1].split("(")[0]):
            missing.append((cls.__name__, line.split()[1].split("(")[0]))
    assert not missing


def test_stub_constructor_matches_the_runtime_one():
    stub = STUB.read_text()
    params = list(inspect.signature(pmx.PrefetchingIter.__init__).parameters)[1:]
    for name in params:
        assert f"{name}:" in stub.split("def __init__", 1)[1].split(") -> None", 1)[0], name


def test_stub_dataloader_constructor_names_every_runtime_parameter():
    """The DataLoader stub takes what the runtime constructor takes, the
    keyword-only loading= too (mypy --strict refused DataLoader(..., loading="threads"))."""
    init = STUB.read_text().split("class DataLoader", 1)[1].split("def __init__", 1)[1].split(") -> None", 1)[0]
    for name in list(inspect.signature(pmx.DataLoader.__init__).parameters)[1:]:
        assert f"{name}:" in init, name
