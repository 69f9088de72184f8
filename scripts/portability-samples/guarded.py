"""Portable or guarded: nothing here may be flagged. The docstring may say /proc freely."""
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc: Linux only")
def test_linux_only():
    assert Path("/proc/self/status").exists()


def test_inline_guard():
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux only")
    Path("/proc/self/stat").read_text()  # a comment may say /proc too


def test_fine():
    subprocess.run(["sed", "-i.bak", "s/a/b/", "f"])
    proc_wait = dict(timeout=5)
    Path("/proc/version")  # portable: only a name in a message, never opened


CASES = [
    ("x", "/etc/hosts"),
] + ([("proc", "/proc/self/environ")] if sys.platform == "linux" else [])
