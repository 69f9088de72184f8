"""The fake llama-server's setups that several test modules share (the fake itself is
tests/python/fake_llama_server.py, installed by `harness.install_fake`)."""

from __future__ import annotations

from pathlib import Path

from . import shim_env

# The fix wisp names for a llama-server built for this machine that dies by SIGILL.
SIGILL_FIX = "WISP_LLAMA_NATIVE=0 make local-model-native"


def shim_env_with(binary: Path, model: Path, mode: str) -> dict[str, str]:
    """A shim on the local model served by `binary` (the fake, in `mode`). WISP_LOCAL_MODEL=1:
    the local model even on a Mac whose Apple model could answer."""
    return shim_env(WISP_LLAMA_SERVER=str(binary), WISP_MODEL_PATH=str(model), WISP_LOCAL_MODEL="1", FAKE_LLAMA_MODE=mode)


def flag_value(argv: list[str], flag: str) -> str:
    """What follows `flag` in a command line."""
    return argv[argv.index(flag) + 1]
