"""scripts/check-portable-tests.py, run by `make test`, against deliberately bad samples
(scripts/portability-samples/): it must flag every Linux-only use that nothing guards, and no guarded one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO

SCRIPT = REPO / "scripts" / "check-portable-tests.py"
# Outside tests/, so that nothing that scans the tests takes the deliberate samples for real ones.
SAMPLES = Path(__file__).resolve().parents[2] / "scripts" / "portability-samples"

spec = importlib.util.spec_from_file_location("check_portable_tests", SCRIPT)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def flagged(path: Path) -> set[int]:
    return {line for _, line, _, _ in check.check_file(path, path.name)}


@pytest.mark.parametrize("name", ["bad.py", "bad.sh", "Bad.swift"])
def test_every_unguarded_use_is_flagged(name):
    path = SAMPLES / name
    marked = {n for n, line in enumerate(path.read_text().splitlines(), 1) if "BAD" in line and not line.lstrip().startswith("#")}
    assert marked and flagged(path) == marked


@pytest.mark.parametrize("name", ["guarded.py", "guarded.sh", "Guarded.swift"])
def test_guarded_uses_and_prose_are_not_flagged(name):
    assert flagged(SAMPLES / name) == set()


def test_removing_a_guard_is_caught(tmp_path):
    text = (SAMPLES / "guarded.py").read_text()
    unguarded = text.replace('@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc: Linux only")\n', "")
    assert unguarded != text
    (tmp_path / "t.py").write_text(unguarded)
    assert flagged(tmp_path / "t.py") == {10}


def test_the_script_fails_on_a_bad_sample_and_passes_on_the_tests():
    bad = subprocess.run([sys.executable, str(SCRIPT), str(SAMPLES / "bad.py")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "bad.py:7: a /proc path" in bad.stderr, bad.stderr  # portable: a message, not a path
    tree = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert tree.returncode == 0, tree.stderr
