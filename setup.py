"""Build of the compiled core, ``prefetch._core`` (Cython + the C in csrc/).

Build modes, from the environment:
  PREFETCH_DEBUG=1     -O0 -g, csrc's asserts on (-UNDEBUG -DPF_DEBUG=1)
  PREFETCH_SANITIZE=1  -fsanitize=address,undefined (run with libasan preloaded)
  PREFETCH_COVERAGE=1  --coverage, and Cython line tracing
  PREFETCH_ANNOTATE=1  write prefetch/_core.html (Cython's GIL/Python-call map)
"""
import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup


def flag(name):
    return os.environ.get(name, "0") not in ("", "0")


debug, sanitize, coverage = flag("PREFETCH_DEBUG"), flag("PREFETCH_SANITIZE"), flag("PREFETCH_COVERAGE")

compile_args = ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-function", "-Wno-unreachable-code"]
link_args = []
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")]
directives = {"language_level": 3, "boundscheck": False, "wraparound": False, "embedsignature": True}

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

setup(ext_modules=cythonize([ext], compiler_directives=directives, annotate=flag("PREFETCH_ANNOTATE")))
