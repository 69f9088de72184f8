"""wisp's one version (pyproject.toml's): what `wisp-mcp --version`, its other names and
`wisp-core --version` print, what the core's Ready frame states, and the shim's refusal of a
core of another version, at start, naming both and what to do."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness import REPO, core_exchange, core_path, error_text, fake_core_binary, shim_command, shim_env, wisp
from wisp_shim import version as version_module

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
VERSION = PYPROJECT["version"]
# The console scripts pip writes beside the interpreter that runs the tests (`pip install -e .`).
SCRIPTS = Path(sys.executable).parent


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=shim_env(), cwd=REPO)


def _script(name: str) -> str:
    path = SCRIPTS / name
    assert os.access(path, os.X_OK), f"no {name} console script in {SCRIPTS}: run `pip install -e '.[test]'`"
    return str(path)


def test_pyproject_declares_the_distribution_and_both_scripts():
    assert PYPROJECT["name"] == "wisp-mcp"
    assert PYPROJECT["scripts"] == {"wisp-mcp": "wisp_shim.__main__:start", "wisp": "wisp_shim.__main__:start"}


@pytest.mark.parametrize("how", ["module", "wisp-mcp", "wisp"])
def test_the_shim_prints_pyprojects_version_under_each_name(how):
    argv = [sys.executable, "-m", "wisp_shim"] if how == "module" else [_script(how)]
    done = _run([*argv, "--version"])
    assert (done.returncode, done.stdout, done.stderr) == (0, f"wisp-mcp {VERSION}\n", "")


def test_the_core_prints_pyprojects_version_and_states_it_in_ready():
    done = _run([core_path(), "--version"])
    assert (done.returncode, done.stdout) == (0, f"wisp-core {VERSION}\n"), done
    frames = core_exchange(["--backend", "echo"], b"", want=(0,))
    assert frames[0]["event"] == "ready" and frames[0]["version"] == VERSION, frames[0]


def test_every_name_takes_the_same_flags():
    module = _run([sys.executable, "-m", "wisp_shim", "--help"])
    assert module.returncode == 0 and "--version" in module.stdout, module
    for name in ("wisp-mcp", "wisp"):
        script = _run([_script(name), "--help"])
        assert script.returncode == 0, script
        # argparse wraps the usage lines after the program's name: compare the flags, not the wrapping.
        assert script.stdout.split(f"usage: {name}")[1].split() == module.stdout.split("usage: python -m wisp_shim")[1].split()


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_load_neither_the_sdk_nor_the_http_stack(flag):
    probe = (
        "import contextlib, io, sys\n"
        f"sys.argv = ['wisp-mcp', {flag!r}]\n"
        "import wisp_shim.__main__ as m\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    m.start()\n"
        "heavy = ('mcp', 'mcp_types', 'starlette', 'sse_starlette', 'uvicorn', 'pydantic', 'httpx', 'jsonschema',\n"
        "         'anyio', 'msgspec', 'wisp_shim.core.client', 'wisp_shim.http.server')\n"
        "print(' '.join(n for n, mod in sys.modules.items()\n"
        "               if (n.split('.')[0] in heavy or n in heavy) and mod is not None))\n"
        "print(hasattr(sys.modules.get('mcp'), 'Client'))\n"
    )
    done = _run([sys.executable, "-c", probe])
    assert done.returncode == 0, done
    loaded, sdk_ran = done.stdout.splitlines()
    # sdk_imports registers `mcp` and `mcp.server` without running their __init__, and holds
    # uvicorn back (None in sys.modules): nothing else of the SDK or the HTTP stack may be in.
    assert set(loaded.split()) <= {"mcp", "mcp.server"} and sdk_ran == "False", f"{flag} imported {loaded}"


def test_a_checkout_never_installed_reads_its_pyproject(tmp_path):
    # The package beside a pyproject.toml of another version, run with no site-packages (-S) and
    # no egg-info: the version can only come from that file.
    shutil.copytree(REPO / "python" / "wisp_shim", tmp_path / "python" / "wisp_shim",
                    ignore=shutil.ignore_patterns("__pycache__"))
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(text.replace(f'version = "{VERSION}"', 'version = "7.7.7"', 1))
    probe = "import sys; sys.path.insert(0, sys.argv[1]); from wisp_shim.version import version; print(version())"
    done = _run([sys.executable, "-S", "-c", probe, str(tmp_path / "python")])
    assert (done.returncode, done.stdout) == (0, "7.7.7\n"), done


def _named(other: str) -> str:
    return f"version {other}" if other else "of no stated version"


@pytest.mark.parametrize("other", ["0.0.1-other", ""])
async def test_a_core_of_another_version_is_refused_at_start(tmp_path, other):
    core, starts = fake_core_binary(tmp_path)
    env = shim_env(WISP_FAKE_CORE_LOG=str(starts), WISP_FAKE_CORE_VERSION=other)
    ours = version_module.version()
    assert ours == VERSION
    async with wisp(core=core, env=env) as c:
        msg = error_text(await asyncio.wait_for(c.call_tool("respond", {"prompt": "hi", "thread_id": "t"}), 30))
    assert msg.startswith("core_unavailable:"), msg
    assert f"wisp-core is {_named(other)}" in msg and f"this wisp-mcp is version {ours}" in msg, msg
    assert "make build" in msg and "reinstall wisp-mcp" in msg, msg


def test_check_states_the_version_of_a_core_it_started():
    done = subprocess.run(shim_command("--backend", "echo", "--check"), capture_output=True, text=True, timeout=60,
                          env=shim_env(), cwd=REPO)
    assert done.returncode == 0, done
    assert f"\nversion:      {VERSION} " in done.stdout, done.stdout


def test_check_refuses_a_core_of_another_version(tmp_path):
    core, _ = fake_core_binary(tmp_path)
    done = subprocess.run(shim_command("--backend", "echo", "--check", core=core), capture_output=True, text=True,
                          timeout=60, env=shim_env(WISP_FAKE_CORE_VERSION="9.9.9"), cwd=REPO)
    assert done.returncode == 1, done
    assert f"wisp-core is version 9.9.9 but this wisp-mcp is version {VERSION}" in done.stderr, done.stderr
