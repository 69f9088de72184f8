#!/usr/bin/env bash
# The Linux wheel with the core inside: stages the package with the static release core in
# wisp_shim/bin/ (find_core looks there first), builds it with the project's own backend
# (setuptools, PEP 517), then tags it with the platform auditwheel judges it to be.
# Usage: scripts/build-wheel.sh CORE PYTHON   (CORE: the static wisp-core; PYTHON: a venv's python
# with wheel and auditwheel). Writes dist/wisp_mcp-<version>-py3-none-<manylinux tag>.whl.
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
mkdir -p "$stage/python/wisp_shim/bin"
install -m 755 "$core" "$stage/python/wisp_shim/bin/wisp-core"
strip "$stage/python/wisp_shim/bin/wisp-core"

"$py" -m pip wheel --quiet --no-deps --no-build-isolation -w "$stage/out" "$stage" >&2
built=$(ls "$stage"/out/*.whl)
# A py3-none-any wheel is "platform-independent" to auditwheel: name the platform first, then ask.
"$py" -m wheel tags --remove --platform-tag "linux_$(uname -m)" "$built" >/dev/null
linux=$(ls "$stage"/out/*linux_*.whl)
"$py" -m auditwheel show "$linux" >&2
tag=$("$py" -m auditwheel show "$linux" | grep -o 'manylinux_[0-9]*_[0-9]*_[a-z0-9_]*' | head -1)
[ -n "$tag" ] || { echo "build-wheel: auditwheel gave no manylinux tag for $linux" >&2; exit 1; }
"$py" -m wheel tags --remove --platform-tag "$tag" "$linux" >/dev/null
final=$(ls "$stage"/out/*"$tag".whl)
size=$(wc -c < "$final")
mkdir -p "$root/dist"
cp "$final" "$root/dist/"
echo "build-wheel: dist/$(basename "$final"): $size bytes (core $(wc -c < "$stage/python/wisp_shim/bin/wisp-core") bytes stripped)" >&2
if [ "$size" -gt "$max_bytes" ]; then
    echo "build-wheel: the wheel is $size bytes, over the $max_bytes allowed: the core still links Foundation (ICU's data); see docs/wheel.md" >&2
    exit 1
fi
