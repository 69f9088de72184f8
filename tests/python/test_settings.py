"""Each WISP_* setting is read in one place on each side: the shim's in config.py (config.env,
which takes only the names SETTINGS declares), the core's in Support/Config.swift; and every
variable the core reads is one the shim's --help declares."""

from __future__ import annotations

import ast
import re

import pytest

from harness import REPO
from wisp_shim import config

PACKAGE = REPO / "python" / "wisp_shim"
ENV_READERS = {"get", "getenv", "pop", "setdefault", "__getitem__"}


def _mentions_wisp(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("WISP_")
               for n in ast.walk(node))


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("environ", "environb")) or (
        isinstance(node, ast.Name) and node.id in ("environ", "environb"))


def direct_reads(source: str) -> list[int]:
    """The lines of `source` that read a WISP_* variable from the environment themselves."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _is_environ(node.value) and _mentions_wisp(node.slice):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            on_environ = _is_environ(node.func.value) and node.func.attr in ENV_READERS
            if (on_environ or node.func.attr in ("getenv", "getenvb")) and any(map(_mentions_wisp, node.args)):
                found.append(node.lineno)
    return found


def test_the_scan_finds_a_direct_read():
    # Without this the test below would pass on a scanner that finds nothing.
    source = 'import os\na = os.environ.get("WISP_X")\nb = os.environ["WISP_Y"]\nc = os.getenv(f"WISP_{1}")\n'
    assert direct_reads(source) == [2, 3, 4]
    assert direct_reads('import os\nx = os.environ.get("XDG_CACHE_HOME")\n') == []


def test_only_config_reads_wisp_variables():
    offenders = {str(path.relative_to(PACKAGE)): lines for path in sorted(PACKAGE.rglob("*.py")) if path.name != "config.py"
                 if (lines := direct_reads(path.read_text(encoding="utf-8")))}
    assert offenders == {}, f"read these through config.env (declared in config.SETTINGS): {offenders}"


def test_every_name_the_package_reads_is_declared():
    named = {m for path in PACKAGE.rglob("*.py")
             for m in re.findall(r'config\.env\("(WISP_[A-Z0-9_]+)"\)', path.read_text(encoding="utf-8"))}
    assert named, "the scan found no config.env reads at all"
    assert named - config.DECLARED == set()


def test_env_refuses_an_undeclared_name_and_reads_the_old_one(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(KeyError, match="WISP_NOT_A_SETTING"):
        config.env("WISP_NOT_A_SETTING")
    monkeypatch.delenv("WISP_LOCAL_CPU_THREADS", raising=False)
    monkeypatch.setenv("WISP_LOCAL_THREADS", "3")
    assert config.env("WISP_LOCAL_CPU_THREADS") == "3"
    monkeypatch.setenv("WISP_LOCAL_CPU_THREADS", "2")
    assert config.env("WISP_LOCAL_CPU_THREADS") == "2"  # the current name wins
    monkeypatch.setenv("WISP_SLOTS", "")
    assert config.env("WISP_SLOTS") is None  # empty is unset, as the core reads it


SWIFT = REPO / "swift"
CORE_CONFIG = SWIFT / "WispCore" / "Support" / "Config.swift"
# main.swift hands the process environment to CoreConfig.parse, which alone looks into it.
CORE_ENV_ENTRY = SWIFT / "wisp-core" / "main.swift"


def test_the_core_reads_its_environment_in_config_swift_only():
    reads = re.compile(r"\bgetenv\(|processInfo\.environment|\benvironment\[")
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in sorted(SWIFT.rglob("*.swift"))
                 if path not in (CORE_CONFIG, CORE_ENV_ENTRY)
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if reads.search(line.split("//")[0])]
    assert offenders == []
    assert reads.search(CORE_CONFIG.read_text(encoding="utf-8")), "Config.swift no longer reads the environment"


def test_every_variable_the_core_reads_is_declared_in_the_shim():
    source = CORE_CONFIG.read_text(encoding="utf-8")
    code = "\n".join(line.split("///")[0] for line in source.splitlines())
    read = set(re.findall(r'"(WISP_[A-Z0-9_]+)"', code))
    assert {"WISP_BACKEND", "WISP_API_KEY"} <= read, read  # the scan sees the table
    assert read - config.DECLARED == set(), "declare these in config.SETTINGS so --help lists them"
