"""wisp's one version: pyproject.toml's `[project] version`, read at run time.

An installed `wisp-mcp` has it in its distribution's metadata (written from pyproject.toml by the
install); a checkout run without installing reads pyproject.toml beside `python/`. wisp-core has
the same version built in (the WispVersion build plugin reads the same file), states it in its
`Ready` frame, and the shim refuses a core of another version (`mismatch`): the pipe between
them is not promised stable across versions.
"""

from __future__ import annotations

import functools
from pathlib import Path

DISTRIBUTION = "wisp-mcp"
# Neither installed nor in a checkout (the package copied somewhere by hand).
UNKNOWN = "unknown"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@functools.cache
def version() -> str:
    # Imported here: `--help` and a stdio start should not pay for them at import.
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return _checkout_version() or UNKNOWN


@functools.cache
def in_checkout() -> bool:
    """Whether this package runs from a wisp checkout (an editable install or the source tree on
    the path), where `make` and the repository's scripts are at hand, rather than from an
    installed wheel."""
    return _checkout_version() is not None


def _checkout_version() -> str | None:
    import tomllib

    try:
        project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    found = project.get("version")
    return found if project.get("name") == DISTRIBUTION and isinstance(found, str) else None


def mismatch(core_version: str) -> str | None:
    """Why a core stating `core_version` in its Ready frame is refused, or None when it is ours."""
    ours = version()
    if core_version == ours and ours != UNKNOWN:
        return None
    theirs = f"version {core_version}" if core_version else "of no stated version (an older build)"
    return (f"wisp-core is {theirs} but this wisp-mcp is version {ours}: the two must come from one release. "
            "In a checkout, rebuild both (`make build`); otherwise reinstall wisp-mcp, or point --core / "
            f"WISP_CORE at a wisp-core {ours}.")
