"""One seam between the core and the drop-ins (SPEC §6, §9 Drop-ins): a
drop-in (each adapter folder: a package under prefetch/, found here by
itself, so a new framework's folder is covered without an edit) imports of
the core only prefetch._framework, whose __all__ declares what that is; the
core imports no drop-in. Read from the sources (AST for Python, the import
lines of Cython), so nothing is imported to check it."""
import ast
import importlib
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "prefetch"
SEAM = "prefetch._framework"
SOURCES = ("*.py", "*.pyi", "*.pyx", "*.pxd", "*.pxi")
_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+c?import\b|c?import\s+([\w.]+(?:\s*,\s*[\w.]+)*))", re.M)


def adapter_folders():
    return sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


def module_of(path):
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def imported(path):
    """The modules ``path`` imports (relative ones resolved), each as written."""
    text = path.read_text()
    package = module_of(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_of(path)
    if path.suffix in (".py", ".pyi"):
        names = []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                    names += [f"{base}.{a.name}" if not node.module else base for a in node.names]
                else:
                    names.append(base)
        return names
    names = []
    for frm, plain in _CYTHON_IMPORT.findall(text):
        names += [frm] if frm else [n.strip() for n in plain.split(",")]
    return names


def core_modules_imported(path, folder):
    """What of the core (prefetch, outside ``folder``) ``path`` imports."""
    own = module_of(folder)
    return [n for n in imported(path)
            if (n == "prefetch" or n.startswith("prefetch.")) and n != own and not n.startswith(own + ".")]


def test_the_adapter_folders_are_found():
    found = {f.name for f in adapter_folders()}
    assert {"torch", "mx"} <= found


@pytest.mark.parametrize("folder", adapter_folders(), ids=lambda f: f.name)
def test_a_drop_in_imports_of_the_core_only_the_seam(folder):
    stray = {f"{p.relative_to(PACKAGE.parent)}: {n}"
             for pattern in SOURCES for p in sorted(folder.rglob(pattern))
             for n in core_modules_imported(p, folder) if n != SEAM}
    assert not stray, f"a drop-in imports the core other than through {SEAM}: {sorted(stray)}"


def test_the_core_imports_no_drop_in():
    folders = [module_of(f) for f in adapter_folders()]
    stray = {f"{p.name}: {n}" for pattern in SOURCES for p in sorted(PACKAGE.glob(pattern))
             for n in imported(p) if any(n == f or n.startswith(f + ".") for f in folders)}
    assert not stray, f"the core imports a drop-in: {sorted(stray)}"


def test_the_seam_declares_what_it_exports():
    seam = importlib.import_module(SEAM)
    assert seam.__all__ and sorted(set(seam.__all__)) == sorted(seam.__all__)
    missing = [n for n in seam.__all__ if not hasattr(seam, n)]
    assert not missing
    # What the drop-ins take from it is declared, not merely reachable.
    taken = set()
    for folder in adapter_folders():
        for p in folder.rglob("*.py*"):
            if p.suffix in (".py", ".pyi"):
                for node in ast.walk(ast.parse(p.read_text())):
                    if isinstance(node, ast.ImportFrom) and node.module == SEAM:
                        taken.update(a.name for a in node.names)
    assert taken - set(seam.__all__) == set()


def test_the_checker_sees_each_kind_of_import(tmp_path):
    """The checks above could fail: each way of writing an import is read."""
    folder = tmp_path / "prefetch" / "newframework"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "a.py").write_text("import prefetch.loader\nfrom prefetch._resume import x\n"
                                 "from .. import _options\nfrom prefetch import Loader\n"
                                 "from prefetch._framework import y\nfrom . import b\n")
    (folder / "c.pyx").write_text("from prefetch._core cimport CopyPlan\ncimport prefetch._core\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "prefetch"
    try:
        assert [f.name for f in adapter_folders()] == ["newframework"]
        assert core_modules_imported(folder / "a.py", folder) == [
            "prefetch.loader", "prefetch._resume", "prefetch._options", "prefetch", "prefetch._framework"]
        assert core_modules_imported(folder / "c.pyx", folder) == ["prefetch._core", "prefetch._core"]
    finally:
        PACKAGE = saved
