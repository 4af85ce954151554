"""The package's shape (SPEC §9): the package within its lines; the map
stage's parts narrow: `_MapStage` within 250 lines and a constructor of at
most 8 parameters; every cdef class layout in a .pxd; a loader thread's
context an object, found through one thread-local owned by one file;
`_EpochBatches` the only writer of its fields. Read from the sources (nothing
is imported), so a change that undoes one fails here."""
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "prefetch"
MAX_STAGE_LINES = 250
# The package's source lines (.py, .pyx, .pxd, .pxi; the .pyi stubs not
# counted). A new capability goes on the core's machinery, not beside it:
# lower this when a change makes the package smaller; raise it only in a
# commit that says what the new lines do and why what is there could not.
MAX_PACKAGE_LINES = 10986
SOURCES = ("*.py", "*.pyx", "*.pxd", "*.pxi")
MAX_STAGE_PARAMS = 8
# The one file that keeps a thread-local of the loader threads: sample_rng()
# and worker_info() take no argument, so they find the calling thread's context
# through it. _warn.py's are not a loader thread's: where any thread's
# warnings point, and the warnings relayed to the consumer.
THREAD_LOCAL_OWNER = "_thread_context.pxi"
NOT_LOADER_THREADS = {"_warn.py"}
_TOP = re.compile(r"^[^\s#]")
_CLASS = re.compile(r"^cdef class (\w+)")
_LOCAL = re.compile(r"^\w[\w ]*=\s*threading\.local\(\)|^cdef object \w+\s*=\s*threading\.local\(\)", re.M)


def classes(text):
    """{name: (first line, its body's lines)} of the top-level cdef classes in ``text``."""
    lines = text.splitlines()
    found = {}
    for i, line in enumerate(lines):
        m = _CLASS.match(line)
        if not m:
            continue
        end = next((j for j in range(i + 1, len(lines)) if _TOP.match(lines[j])), len(lines))
        while end > i + 1 and not lines[end - 1].strip():
            end -= 1
        found[m.group(1)] = (i, lines[i + 1:end])
    return found


def fields(body):
    """The attribute declarations in a class body: `cdef <type> <name>` one
    level in, neither a method (no parenthesis) nor a block."""
    return [ln for ln in body if re.match(r"^    cdef\s+[^(]*$", ln) and not ln.rstrip().endswith(":")]


def params(body):
    """The parameters of the class's __cinit__ (or __init__), self and a bare * left out."""
    text = "\n".join(body)
    m = re.search(r"def __c?init__\(", text)
    assert m, "no constructor"
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    inner, parts, depth, cur = text[m.end():i - 1], [], 0, ""
    for ch in inner:
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return [p for p in parts if p and p not in ("self", "*")]


def epoch_batches_written(text):
    """Lines of ``text`` (the map stage's file) that assign or delete a field
    of an _EpochBatches (``self.e``, or a name declared of that type)."""
    names = {"self.e"} | set(re.findall(r"cdef _EpochBatches (\w+)", text))
    ref = "|".join(re.escape(n) for n in names)
    write = re.compile(rf"(?<![\w.])(?:{ref})\.\w+(?:\[[^\]]*\])?\s*(?:[-+*/|&]?=)(?!=)"
                       rf"|\bdel\s+(?:{ref})\.|(?<![\w.])(?:{ref})\.\w+\s*,[^=\n]*=(?!=)")
    return [ln.strip() for ln in text.splitlines() if write.search(ln.split("#")[0])]


def layouts_outside_pxd():
    """(file, class) of each cdef class with fields declared outside a .pxd."""
    return [(p.name, name) for pattern in ("*.pxi", "*.pyx") for p in sorted(PACKAGE.glob(pattern))
            for name, (_, body) in classes(p.read_text()).items() if fields(body)]


def thread_local_files():
    return sorted(p.name for pattern in ("*.pxi", "*.pyx", "*.py") for p in PACKAGE.glob(pattern)
                  if p.name not in NOT_LOADER_THREADS and _LOCAL.search(p.read_text()))


def package_lines(root):
    return sum(len(p.read_text().splitlines()) for pattern in SOURCES for p in root.rglob(pattern))


def test_the_package_stays_within_its_lines():
    assert package_lines(PACKAGE) <= MAX_PACKAGE_LINES, (
        f"prefetch/ is {package_lines(PACKAGE)} lines, over {MAX_PACKAGE_LINES}: see MAX_PACKAGE_LINES")


def test_the_map_stage_stays_within_its_lines_and_parameters():
    first, body = classes((PACKAGE / "_map.pxi").read_text())["_MapStage"]
    assert 1 + len(body) <= MAX_STAGE_LINES, f"_MapStage is {1 + len(body)} lines"
    assert len(params(body)) <= MAX_STAGE_PARAMS, params(body)


def test_every_cdef_class_layout_is_in_a_pxd():
    assert layouts_outside_pxd() == []


def test_one_file_keeps_the_loader_threads_thread_local_and_only_it_reads_it():
    assert thread_local_files() == [THREAD_LOCAL_OWNER]
    owner = (PACKAGE / THREAD_LOCAL_OWNER).read_text()
    name = re.search(r"^cdef object (\w+)\s*=\s*threading\.local\(\)", owner, re.M).group(1)
    readers = sorted(p.name for pattern in ("*.pxi", "*.pyx", "*.pxd") for p in PACKAGE.glob(pattern)
                     if p.name != THREAD_LOCAL_OWNER and re.search(rf"\b{name}\b", p.read_text()))
    assert readers == []


def test_the_map_stage_leaves_the_epoch_batches_fields_to_them():
    assert epoch_batches_written((PACKAGE / "_map.pxi").read_text()) == []


def test_the_checks_see_what_they_guard(tmp_path):
    """Each check fails on a source that breaks its rule (a check that never
    fails would pass the tests above whatever the sources say)."""
    (tmp_path / "sub").mkdir()
    for name, text in {"a.py": "x\ny\n", "sub/b.pxi": "z\n", "c.pyi": "s\n", "d.c": "c\n"}.items():
        (tmp_path / name).write_text(text)
    assert package_lines(tmp_path) == 3
    stage = "cdef class _MapStage:\n    def __cinit__(self, a, b=(1, 2), *, c, d=[3, 4]):\n" + "        x\n" * 300
    first, body = classes(stage + "\n\ncdef class _Next:\n    pass\n")["_MapStage"]
    assert 1 + len(body) == 302 and params(body) == ["a", "b=(1, 2)", "c", "d=[3, 4]"]
    layout = "cdef class _Held:\n    cdef object x          # a field\n\n    cdef int f(self):\n        cdef int y\n"
    assert [n for n, (_, b) in classes(layout).items() if fields(b)] == ["_Held"]
    assert not fields(classes("cdef class _Ok:\n    cdef int f(self)\n    def g(self):\n        cdef int y\n")
                      ["_Ok"][1])
    assert _LOCAL.search("cdef object _tls = threading.local()   # per thread")
    assert _LOCAL.search("_here = threading.local()")
    assert len(epoch_batches_written(
        "    cdef _EpochBatches e = self.e\n        del e.pending[b.k]\n        e.taken += 1\n"
        "        self.failure, e.failure = e.failure, None\n        e.stop_k = min(e.stop_k, e.taken)\n"
        "        self.e.exhausted = True\n        if e.taken == 3:\n        e.take(b)\n")) == 5
