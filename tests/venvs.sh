# Environments for the README commands (tests/run.sh, bench/main.sh): sourced, not run.
# Sets up the package the way a user gets it, and no more often than needed:
#   pf_lock             fails with a message when another of them runs on the same environments.
#   pf_sdist            builds the sdist from the checkout (python -m build, 4 s) into build/dist and
#                       unpacks it to $PF_SRC; keeps the previous one, and the wheels built from it,
#                       when its files are the same (a hash of the tar members' names and contents).
#                       Under CI it is built once per run and then reused as it is: the checkout does
#                       not change during a run, and no later step walks the checkout (tests/newest.sh
#                       may have mounted the checkout's parent under build/ meanwhile).
#   pf_env NAME PY EXTRAS
#                       a venv $PREFETCH_ENVS/NAME (default build/test-envs/NAME) with the package
#                       installed from a wheel that pip builds from that sdist, plus EXTRAS (e.g.
#                       "test,mxnet"). The venv is kept while its key holds: a hash of pyproject.toml,
#                       setup.py, the interpreter (version and path), NAME and EXTRAS; otherwise it is
#                       made anew. When only the sources changed, just the package is reinstalled
#                       (pip install --no-deps --force-reinstall). Sets PF_VENV.
#                       A venv is complete when its .key is there: written last, and removed first
#                       whenever it is remade (before rm -rf, which an interrupt can stop half-way),
#                       so a run interrupted while making it leaves a venv the next run remakes,
#                       never one it reuses half-built. .sources (the package's hash) likewise.
#                       One torch: any EXTRAS naming torch (the tests' "test,torch", the benchmark's
#                       "bench,torch,bench-peers") get the one venv NAME=torch with all four, so torch
#                       (about 1.1 GB) is installed once in build/ and not once per command.
#   pf_extra VENV EXTRA adds the package's EXTRA to a venv pf_env made (tests/run.sh --full: the torch
#                       venv's "test-frameworks", Lightning, Accelerate, Hugging Face datasets and
#                       webdataset, which only the long tier's tests use); once per venv.
#   pf_find_python 3.X  prints an interpreter of that version, or nothing.
# Under CI (CI set and not "false"/"0") every venv and the sdist are made anew once per CI run
# (PREFETCH_RUN names the run; .ci/run sets it, so the steps of one run share what they built).
# Needs $root (the checkout). Messages go to stderr.

pf_envs="${PREFETCH_ENVS:-$root/build/test-envs}"
pf_dist="$root/build/dist"
pf_ci=0
if [[ -n "${CI:-}" && "${CI}" != false && "${CI}" != 0 ]]; then pf_ci=1; fi
if [[ $pf_ci == 1 && -z "${PREFETCH_RUN:-}" ]]; then export PREFETCH_RUN="$$-$(date +%s)"; fi
pf_run="${PREFETCH_RUN:-local}"

pf_lock() {  # one tests/run.sh or bench/main.sh at a time per checkout: they share build/dist and the
             # venvs. The lock is held until the script and what it exec'd exit. $1: another lock
             # name, for a step that shares neither (tests/run.sh --pythons under CI).
    command -v flock >/dev/null 2>&1 || return 0
    local name="${1:-.lock}"
    mkdir -p "$pf_envs"
    exec {pf_lock_fd}>>"$pf_envs/$name"
    if ! flock -n "$pf_lock_fd"; then
        echo "$(basename "$0"): another tests/run.sh or bench/main.sh (pid $(cat "$pf_envs/$name.pid" 2>/dev/null ||
            echo '?')) is using $pf_envs; wait for it to finish (they share the environments)." >&2
        exit 1
    fi
    echo $$ >"$pf_envs/$name.pid"
}

pf_find_python() {  # $1 = major.minor
    local c
    for c in "python$1" "/root/.pyenv/versions/$1"*/bin/python3 "$HOME/.pyenv/versions/$1"*/bin/python3; do
        if command -v "$c" >/dev/null 2>&1 &&
            "$c" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$1'.split('.')))" 2>/dev/null; then
            command -v "$c"; return
        fi
    done
}

pf_hash() {  # sha256 of the named files' contents and of extra words; prints the hex digest
    python3 -c 'import hashlib, sys
h = hashlib.sha256()
for a in sys.argv[1:]:
    h.update(open(a[5:], "rb").read() if a.startswith("file:") else a.encode())
    h.update(b"\0")
print(h.hexdigest())' "$@"
}

pf_fresh() {  # $1 = a stamp file: true when what it stamps must be made anew in this CI run
    [[ $pf_ci == 1 && "$(cat "$1" 2>/dev/null)" != "$pf_run" ]]
}

pf_tools() {  # a venv with `build` and `ruff` (what makes the sdist and lints); sets PF_TOOLS
    local py="${PYTHON:-$(pf_find_python 3.11)}"
    py="${py:-python3}"
    PF_TOOLS="$pf_envs/tools"
    local key
    key="$(pf_hash "$("$py" -c 'import sys; print(sys.version, sys.executable)')" "build ruff")"
    if pf_fresh "$PF_TOOLS/.run" || [[ "$(cat "$PF_TOOLS/.key" 2>/dev/null)" != "$key" ]] ||
        ! "$PF_TOOLS/bin/python" -c "import build" 2>/dev/null; then
        echo "=== [tools] making $PF_TOOLS" >&2
        rm -f "$PF_TOOLS/.key"
        rm -rf "$PF_TOOLS"
        "$py" -m venv "$PF_TOOLS"
        "$PF_TOOLS/bin/python" -m pip install -q --upgrade pip build ruff >/dev/null
        echo "$key" >"$PF_TOOLS/.key"
        echo "$pf_run" >"$PF_TOOLS/.run"
    fi
}

pf_sdist() {  # sets PF_SDIST (the .tar.gz), PF_SRC (unpacked), PF_HASH (its contents)
    pf_tools
    if [[ $pf_ci == 1 && "$(cat "$pf_dist/.run" 2>/dev/null)" == "$pf_run" ]] &&
        ls "$pf_dist"/sdist/*.tar.gz >/dev/null 2>&1 && ls -d "$pf_dist"/src/*/ >/dev/null 2>&1; then
        PF_HASH="$(cat "$pf_dist/.hash")"
        PF_SDIST="$(ls "$pf_dist"/sdist/*.tar.gz)"
        PF_SRC="$(ls -d "$pf_dist"/src/*/)"
        PF_SRC="${PF_SRC%/}"
        echo "=== [sdist] $(basename "$PF_SDIST") (made earlier in this CI run)" >&2
        return 0
    fi
    local new="$pf_dist/new.$$"  # per process: two steps of one CI run may start side by side
    rm -rf "$new"
    if ! "$PF_TOOLS/bin/python" -m build --sdist -o "$new" "$root" >"$pf_dist.log" 2>&1; then
        cat "$pf_dist.log" >&2
        echo "tests/venvs.sh: building the sdist failed (log above, also in $pf_dist.log)" >&2
        return 1
    fi
    local tarball
    tarball="$(ls "$new"/*.tar.gz)"
    PF_HASH="$("$PF_TOOLS/bin/python" -c 'import hashlib, sys, tarfile
h = hashlib.sha256()
with tarfile.open(sys.argv[1]) as t:
    for m in sorted(t.getmembers(), key=lambda m: m.name):
        if m.isfile():
            h.update(m.name.encode() + b"\0" + t.extractfile(m).read() + b"\0")
print(h.hexdigest())' "$tarball")"
    if pf_fresh "$pf_dist/.run" || [[ "$(cat "$pf_dist/.hash" 2>/dev/null)" != "$PF_HASH" ]] ||
        ! ls -d "$pf_dist"/src/*/ >/dev/null 2>&1; then
        echo "=== [sdist] $(basename "$tarball") (sources changed: wheels are rebuilt from it)" >&2
        rm -f "$pf_dist/.hash"   # first: the unpacked sdist is complete only once it is written again
        rm -rf "$pf_dist/sdist" "$pf_dist/src" "$pf_dist/wheels"
        mv "$new" "$pf_dist/sdist"
        mkdir -p "$pf_dist/src"
        tar -C "$pf_dist/src" -xzf "$pf_dist/sdist/$(basename "$tarball")"
        echo "$PF_HASH" >"$pf_dist/.hash"
        echo "$pf_run" >"$pf_dist/.run"
    else
        rm -rf "$new"
    fi
    PF_SDIST="$(ls "$pf_dist"/sdist/*.tar.gz)"
    PF_SRC="$(ls -d "$pf_dist"/src/*/)"
    PF_SRC="${PF_SRC%/}"
}

pf_wheel() {  # $1 = venv: prints the wheel for its interpreter, built from $PF_SDIST by pip when missing
    local venv="$1" tag dir
    tag="$("$venv/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
    dir="$pf_dist/wheels/$tag"
    if ! ls "$dir"/*.whl >/dev/null 2>&1; then
        echo "=== [wheel] $tag from $(basename "$PF_SDIST")" >&2
        # Build isolation, as `pip install <sdist>` does: Cython 3 and numpy 2 from pyproject.toml.
        # Built aside, then moved in whole: two CI lanes may need the same wheel at once.
        rm -rf "$dir.new.$$"
        "$venv/bin/python" -m pip wheel -q --no-deps "$PF_SDIST" -w "$dir.new.$$" >&2
        mkdir -p "$dir"
        mv "$dir.new.$$"/*.whl "$dir"/
        rm -rf "$dir.new.$$"
    fi
    ls "$dir"/*.whl
}

pf_env() {  # $1 = name, $2 = python, $3 = extras; needs pf_sdist first; sets PF_VENV
    local name="$1" py="$2" extras="$3" key whl
    if [[ ",$extras," == *,torch,* ]]; then name=torch; extras="test,bench,torch,bench-peers"; fi
    PF_VENV="$pf_envs/$name"
    key="$(pf_hash file:"$root/pyproject.toml" file:"$root/setup.py" file:"$root/tests/pins.txt" \
        "$("$py" -c 'import sys; print(sys.version, sys.executable)')" "$name" "$extras")"
    if pf_fresh "$PF_VENV/.run" || [[ "$(cat "$PF_VENV/.key" 2>/dev/null)" != "$key" ]] ||
        ! "$PF_VENV/bin/python" -c "" 2>/dev/null; then
        echo "=== [$name] making $PF_VENV ($("$py" --version), extras: $extras)" >&2
        rm -f "$PF_VENV/.key" "$PF_VENV/.sources"
        rm -rf "$PF_VENV"
        "$py" -m venv "$PF_VENV"
        "$PF_VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
        whl="$(pf_wheel "$PF_VENV")"
        # The extras' lower bounds, under the versions the tests pin (tests/pins.txt).
        "$PF_VENV/bin/python" -m pip install -q -c "$root/tests/pins.txt" "$whl[$extras]"
        echo "$key" >"$PF_VENV/.key"
        echo "$pf_run" >"$PF_VENV/.run"
    elif [[ "$(cat "$PF_VENV/.sources" 2>/dev/null)" != "$PF_HASH" ]]; then
        echo "=== [$name] reusing $PF_VENV; sources changed: reinstalling the package only" >&2
        rm -f "$PF_VENV/.sources"
        whl="$(pf_wheel "$PF_VENV")"
        "$PF_VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$whl"
    else
        echo "=== [$name] reusing $PF_VENV (nothing changed)" >&2
    fi
    echo "$PF_HASH" >"$PF_VENV/.sources"
}

pf_extra() {  # $1 = a venv made by pf_env, $2 = an extra of the package
    local venv="$1" extra="$2" stamp="$1/.extra-$2" whl
    if [[ "$(cat "$stamp" 2>/dev/null)" != "$(cat "$venv/.key")" ]]; then
        echo "=== [$(basename "$venv")] adding the [$extra] extra" >&2
        rm -f "$stamp"
        whl="$(pf_wheel "$venv")"
        "$venv/bin/python" -m pip install -q -c "$root/tests/pins.txt" "$whl[$extra]"
        cp "$venv/.key" "$stamp"
    fi
}
