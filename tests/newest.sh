#!/usr/bin/env bash
# The core tests on the newest CPythons (3.14, 3.15), built by the newest GCC (16) under -Werror
# (SPEC §8, issue 18):
#   bash tests/newest.sh [extra pytest args]
# The host's Pythons and compiler are older, so this runs in a Debian unstable root folder made by
# newest-python.sh (the tool SPEC §8 names; found as $PREFETCH_NEWEST_TOOL, else in shared/tools/
# beside the checkout, else in /work/shared/tools/). Needs root (chroot, mount) and the network.
# 1. Builds the sdist from the checkout (tests/venvs.sh, as tests/run.sh does).
# 2. Makes the root folder in build/newest (PREFETCH_NEWEST_ROOT moves it) if it is missing (about
#    a minute), mounts the checkout's parent at /src in it, and makes that mount read-only.
# 3. For each of 3.14 and 3.15, inside the root: a venv /opt/pf-3.X, a wheel that pip builds from
#    the sdist with build isolation and PREFETCH_WERROR=1 (any compiler warning fails the build),
#    the wheel installed with the test extra, and tests/core -m "not stress" run from the sdist
#    unpacked in /opt/pf-3.X/src.
# Unmounts everything when it ends, also on SIGINT/SIGTERM (timeout). Killed harder (SIGKILL), it
# leaves the mounts: run `bash tests/newest.sh --down` before deleting build/. Exits non-zero on the
# first failure.
set -euo pipefail

if [[ "${1:-}" == --inside ]]; then  # run by step 3 inside the root folder: $2 = Python version, $3 = sdist
    v="$2" sdist="$3"; shift 3
    venv="/opt/pf-$v"
    echo "=== [newest $v] $(python$v --version), $(gcc --version | head -1)" >&2
    rm -rf "$venv"
    "python$v" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    # No wheel cache: pip would key it by the sdist's name, which stays while its contents change.
    PREFETCH_WERROR=1 "$venv/bin/python" -m pip wheel -q --no-cache-dir --no-deps "$sdist" -w "$venv/wheel" >&2
    whl="$(ls "$venv"/wheel/*.whl)"
    "$venv/bin/python" -m pip install -q "$whl[test]"
    mkdir "$venv/src"
    tar -C "$venv/src" -xzf "$sdist"
    src="$(ls -d "$venv"/src/*/)"
    # The pytest script, not python -m pytest, keeps the sdist's uncompiled prefetch/ off sys.path.
    cd "$src"
    "$venv/bin/pytest" -c "$src/pyproject.toml" --rootdir "$src" tests/core -m "not stress" "$@"
    exit 0
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chroot_dir="${PREFETCH_NEWEST_ROOT:-$root/build/newest}"
tool="${PREFETCH_NEWEST_TOOL:-}"
if [[ -z "$tool" ]]; then
    for t in "$root/../shared/tools/newest-python.sh" /work/shared/tools/newest-python.sh; do
        if [[ -f "$t" ]]; then tool="$t"; break; fi
    done
fi
if [[ -z "$tool" || ! -f "$tool" ]]; then
    echo "tests/newest.sh: newest-python.sh not found (set PREFETCH_NEWEST_TOOL to it)" >&2
    exit 1
fi
if [[ $(id -u) != 0 ]]; then
    echo "tests/newest.sh: needs root (newest-python.sh uses chroot and mount)" >&2
    exit 1
fi
# The tool mounts the parent of the folder it runs in at /src and runs commands in /src/<that
# folder's name>: run it from the checkout, wherever that was cloned.
newest() { (cd "$root" && bash "$tool" "$chroot_dir" "$@"); }
if [[ "${1:-}" == --down ]]; then newest down; exit 0; fi

source "$root/tests/venvs.sh"
start=$SECONDS
# The sdist before the mounts: setuptools lists every file under the checkout before it applies
# MANIFEST.in, and with the root folder mounted that would be all of the checkout's parent.
pf_sdist
trap 'newest down' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "=== [newest] root folder $chroot_dir" >&2
newest >&2
# Read-only: nothing inside writes to the checkout, and a `rm -rf build` while this runs cannot
# reach the checkout's parent through build/newest/src.
mount -o remount,bind,ro "$chroot_dir/src"
sdist_inside="/src/$(basename "$root")${PF_SDIST#"$root"}"
extra=""
if [[ $# -gt 0 ]]; then extra="$(printf ' %q' "$@")"; fi
for v in 3.14 3.15; do
    newest run "bash tests/newest.sh --inside $v $sdist_inside$extra"
done
echo "tests/newest.sh: 3.14 and 3.15 passed (GCC 16, -Werror) in $((SECONDS - start)) s" >&2
