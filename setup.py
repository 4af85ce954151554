"""Build of the compiled core, ``prefetch._core`` (Cython + the C in csrc/).

Build modes, from the environment:
  PREFETCH_DEBUG=1     -O0 -g, csrc's asserts on (-UNDEBUG -DPF_DEBUG=1)
  PREFETCH_SANITIZE=1  -fsanitize=address,undefined (run with libasan preloaded)
  PREFETCH_COVERAGE=1  --coverage, and Cython line tracing
  PREFETCH_ANNOTATE=1  write prefetch/_core.html (Cython's GIL/Python-call map)
  PREFETCH_WERROR=1    -Werror: any compiler warning fails the build (CI: tests/newest.sh, tests/sanitize.sh)
"""
import glob
import os
import shlex
import shutil
import sys
import sysconfig

# A broken install fails here with what is missing and what to do, not with a traceback from the
# build backend. pip shows these lines under "error: subprocess-exited-with-error".
if sys.version_info < (3, 10):  # noqa: UP036 (requires-python is read only after this file ran)
    sys.exit(f"prefetch-ring needs Python >= 3.10; this is Python {sys.version.split()[0]} "
             f"({sys.executable}).\n"
             "Make a venv with a newer Python (e.g. python3.11 -m venv .venv) and install from there.")
try:
    import numpy
    from Cython.Build import cythonize
except ImportError as e:  # only without build isolation: pip install . installs both by itself
    sys.exit(f"prefetch-ring's build needs Cython >= 3.0 and numpy >= 2.0 ({e}).\n"
             "Use `pip install .` (it fetches them), or `pip install 'Cython>=3' 'numpy>=2' setuptools` "
             "before building with --no-build-isolation.")
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def flag(name):
    return os.environ.get(name, "0") not in ("", "0")


debug, sanitize, coverage = flag("PREFETCH_DEBUG"), flag("PREFETCH_SANITIZE"), flag("PREFETCH_COVERAGE")
werror = flag("PREFETCH_WERROR")

compile_args = ["-std=c11", "-Wall", "-Wextra"]
link_args = []
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")]
directives = {"language_level": 3, "boundscheck": False, "wraparound": False, "embedsignature": True}

if werror:
    compile_args.append("-Werror")
if sys.version_info >= (3, 15):
    # CPython 3.15's PyTypeObject has a new last field (_tp_iteritem) that the static type objects
    # Cython (3.3.1, the newest) writes for each cdef class leave out: -Wextra's
    # -Wmissing-field-initializers then warns once per class, on Cython's code only. The C in csrc/
    # loses nothing: tests/csrc builds it on its own with the full -Wall -Wextra -Werror.
    compile_args.append("-Wno-missing-field-initializers")
if sys.platform != "win32":
    compile_args.append("-pthread")
    link_args.append("-pthread")
if debug:
    compile_args += ["-O0", "-g", "-UNDEBUG"]
    macros.append(("PF_DEBUG", "1"))
else:
    compile_args.append("-O2")
if sanitize:
    compile_args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
    link_args += ["-fsanitize=address,undefined"]
if coverage:
    compile_args.append("--coverage")
    link_args.append("--coverage")
    macros.append(("CYTHON_TRACE_NOGIL", "1"))
    directives["linetrace"] = True

ext = Extension(
    "prefetch._core",
    ["prefetch/_core.pyx", "csrc/pf_sync.c", "csrc/pf_ring.c", "csrc/pf_pool.c", "csrc/pf_copy.c"],
    include_dirs=["csrc", numpy.get_include()],
    define_macros=macros,
    extra_compile_args=compile_args,
    extra_link_args=link_args,
)

# Adapters' compiled helpers (prefetch/<framework>/_*.pyx) build with no edit
# here. They link against nothing but libc: a framework's library is reached
# through the one it has already loaded.
adapters = [
    Extension(path[:-4].replace("/", "."), [path], include_dirs=["csrc", numpy.get_include()],
              define_macros=macros,
              extra_compile_args=compile_args, extra_link_args=link_args)
    for path in sorted(glob.glob("prefetch/*/_*.pyx"))
]


class build_ext_checked(build_ext):
    """Checks for a C compiler before compiling: without one, say so and how to get one."""

    def run(self):
        if sys.platform != "win32":  # MSVC is found by setuptools' own search, with its own message
            cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
            exe = shlex.split(cc)[0]
            if shutil.which(exe) is None:
                source = "$CC" if os.environ.get("CC") else "Python's build configuration"
                sys.exit(f"prefetch-ring has a compiled core and needs a C compiler; none found "
                         f"(looked for {exe!r}, named by {source}).\n"
                         "Install one (Debian/Ubuntu: apt-get install gcc; Fedora: dnf install gcc; "
                         "macOS: xcode-select --install) or point CC at it, then install again.")
        super().run()


setup(ext_modules=cythonize([ext] + adapters, compiler_directives=directives,
                            annotate=flag("PREFETCH_ANNOTATE")),
      cmdclass={"build_ext": build_ext_checked})
