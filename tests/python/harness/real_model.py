"""The real local model (`make local-model`: llama.cpp's llama-server with SmolLM2-135M) as
the real-model tests use it: whether it is installed, a server of it, wisp in front of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import shim_env, wait_until, wisp
from openai_stub import RecordingProxy
from wisp_shim.localmodel import llama_server, local_model


def installed() -> tuple[local_model.ServerProgram, Path] | str:
    try:
        server, model = local_model.find_server(), local_model.find_model()
    except local_model.LocalModelError as exc:
        return str(exc)
    if server is None or model is None:
        what = " and ".join(x for x, v in (("llama.cpp's server", server), ("the SmolLM2 model", model)) if v is None)
        return f"the local model is not installed ({what} missing): {local_model.install_hint()}"
    return server, model


# The model and its server, or why they cannot be had.
FOUND = installed()


def skip_unless_installed() -> pytest.MarkDecorator | None:
    """A module's `pytestmark` when the model is missing: a skip with the reason, or, with
    WISP_REQUIRE_LOCAL_MODEL=1 (set by CI), a failure, so CI cannot pass without the model."""
    if not isinstance(FOUND, str):
        return None
    if os.environ.get("WISP_REQUIRE_LOCAL_MODEL") == "1":
        pytest.fail(f"WISP_REQUIRE_LOCAL_MODEL=1 but {FOUND}", pytrace=False)
    return pytest.mark.skip(reason=FOUND)


def serve(context_size: int, slots: int = 1):
    assert not isinstance(FOUND, str)
    server, model = FOUND
    lm = local_model.LocalModel.of(server, model, context_size=context_size, slots=slots)
    lm.spawn()
    def up() -> bool:
        assert lm.proc is not None and lm.proc.poll() is None, "llama-server exited while starting"
        return lm.healthy()

    assert wait_until(up, 120), "llama-server did not become healthy in 120 s"
    return lm


def via(proxy: RecordingProxy, *args: str):
    return wisp("--endpoint", proxy.endpoint, "--model", llama_server.MODEL_ALIAS, *args, backend="openai", env=shim_env())
