#!/usr/bin/env bash
# The wheel with the core inside: stages the package with the release core in wisp_shim/bin/
# (find_core looks there first), builds it with the project's own backend (setuptools, PEP 517),
# then tags it with its platform:
# - Linux: the static core; the manylinux platform auditwheel judges it to be.
# - macOS: the release core (it uses the system's Foundation and SQLite, which every Mac has); the
#   macOS floor Package.swift names, for this machine's architecture. The core is re-signed ad hoc
#   after strip rewrites it (arm64 runs no binary whose signature does not match), and it must run
#   here and link nothing outside /usr/lib and /System before it is packed.
# Usage: scripts/build-wheel.sh CORE PYTHON   (CORE: the core to pack; PYTHON: a venv's python
# with wheel, and on Linux auditwheel). Writes dist/wisp_mcp-<version>-py3-none-<platform>.whl.
set -euo pipefail
core=$1 py=$2
root=$(cd "$(dirname "$0")/.." && pwd)
# The size the issue allows the wheel; PyPI's default limit is far above it.
max_bytes=15000000

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$root/pyproject.toml" "$root/README.md" "$stage/"
cp -R "$root/python" "$stage/python"
find "$stage/python" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
bundled="$stage/python/wisp_shim/bin/wisp-core"
mkdir -p "$stage/python/wisp_shim/bin"
install -m 755 "$core" "$bundled"

case "$(uname -s)" in
Darwin)
    strip -x "$bundled"
    codesign --force --sign - "$bundled"
    # Trusted because it ran here, not because it linked.
    "$bundled" --version >/dev/null || { echo "build-wheel: the stripped, re-signed core does not run" >&2; exit 1; }
    outside=$(otool -L "$bundled" | tail -n +2 | awk '{print $1}' | grep -v -e '^/usr/lib/' -e '^/System/Library/' || true)
    if [ -n "$outside" ]; then
        echo "build-wheel: the core links libraries a Mac without this toolchain lacks: $outside" >&2
        exit 1
    fi
    floor=$(sed -n 's/.*\.macOS(\.v\([0-9][0-9]*\)).*/\1/p' "$root/Package.swift" | head -1)
    [ -n "$floor" ] || { echo "build-wheel: no .macOS(.vN) floor in Package.swift" >&2; exit 1; }
    tag="macosx_${floor}_0_$(uname -m)"
    ;;
*)
    strip "$bundled"
    ;;
esac

"$py" -m pip wheel --quiet --no-deps --no-build-isolation -w "$stage/out" "$stage" >&2
built=$(ls "$stage"/out/*.whl)
if [ -z "${tag:-}" ]; then
    # A py3-none-any wheel is "platform-independent" to auditwheel: name the platform first, then ask.
    "$py" -m wheel tags --remove --platform-tag "linux_$(uname -m)" "$built" >/dev/null
    built=$(ls "$stage"/out/*linux_*.whl)
    "$py" -m auditwheel show "$built" >&2
    tag=$("$py" -m auditwheel show "$built" | grep -o 'manylinux_[0-9]*_[0-9]*_[a-z0-9_]*' | head -1)
    [ -n "$tag" ] || { echo "build-wheel: auditwheel gave no manylinux tag for $built" >&2; exit 1; }
fi
"$py" -m wheel tags --remove --platform-tag "$tag" "$built" >/dev/null
final=$(ls "$stage"/out/*"$tag".whl)
size=$(wc -c < "$final")
mkdir -p "$root/dist"
cp "$final" "$root/dist/"
echo "build-wheel: dist/$(basename "$final"): $size bytes (core $(wc -c < "$bundled") bytes stripped)" >&2
if [ "$size" -gt "$max_bytes" ]; then
    echo "build-wheel: the wheel is $size bytes, over the $max_bytes allowed: the core still links Foundation (ICU's data); see docs/wheel.md" >&2
    exit 1
fi
