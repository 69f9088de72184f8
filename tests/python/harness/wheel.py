"""The built wheel as a user installs it, shared by tests/python/test_wheel.py and bench/wheel_bench.py."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def built_wheel() -> Path | None:
    """The wheel `make wheel` wrote last to dist/ (the newest by time: names sort 0.10 before 0.9)."""
    found = [*(REPO / "dist").glob("wisp_mcp-*-py3-none-manylinux*.whl"), *(REPO / "dist").glob("wisp_mcp-*-py3-none-macosx*.whl")]
    wheels = sorted(found, key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


def clean_env(bindir: Path, home: Path) -> dict[str, str]:
    """The user's shell after `pip install`: the venv's bin first, no checkout on PYTHONPATH, no
    swift on PATH, no WISP_* setting (a core named from outside, say) from the developer's shell."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WISP_") and k not in drop}
    env.update(PATH=f"{bindir}:/usr/bin:/bin", HOME=str(home))
    return env
