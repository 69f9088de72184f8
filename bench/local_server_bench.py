"""The local model's start, per server: `local_model_first_answer_s` is a fresh wisp process (the
model already installed) to its first real answer, for the xllamacpp wheel and for a compiled
llama-server, each where it is installed (bench/run.py --only first_answer).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from clients import CORE, PY, REPO, child_env

FIRST_ANSWER_ROWS = [
    ("local_model_first_answer_s_xllamacpp", "local model: fresh wisp to first answer, xllamacpp wheel (s)", "{:.2f}"),
    ("local_model_first_answer_s_native", "  the same, compiled llama-server (s)", "{:.2f}"),
]
FIRST_ANSWER_TARGETS: dict[str, tuple[float, str]] = {}
PROMPT = "What is the capital of France? Answer in one word."


def _env(kind: str, server: Path, scratch: Path) -> dict[str, str]:
    env = {**child_env(), "WISP_LOCAL_MODEL": "1"}
    if kind == "native":
        env["WISP_LLAMA_SERVER"] = str(server)
    else:
        # No compiled server to prefer: an empty cache, and no llama-server on PATH.
        env["WISP_CACHE_DIR"] = str(scratch)
        env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                      if d and not (Path(d) / "llama-server").exists())
    return env


async def _once(env: dict[str, str]) -> float:
    from mcp import Client, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=PY, args=["-m", "wisp_shim", "--core", str(CORE), "--backend", "auto"],
                                   env=env, cwd=str(REPO))
    with tempfile.TemporaryFile("w+") as errlog:
        t0 = time.perf_counter()
        async with Client(stdio_client(params, errlog=errlog)) as c:
            r = await c.call_tool("respond", {"prompt": PROMPT, "temperature": 0, "max_output_tokens": 16})
            took = time.perf_counter() - t0
        if r.is_error or "paris" not in str(r.structured_content).lower():
            errlog.seek(0)
            raise AssertionError(f"no real answer: {r.content!r}\n{errlog.read()[-2000:]}")
    return took


async def first_answer(repeats: int) -> dict[str, Any]:
    from wisp_shim.localmodel import local_model

    out: dict[str, Any] = {}
    runs: dict[str, list[float]] = {}
    native = shutil.which("llama-server") or (str(local_model.cached_llama_server())
                                              if local_model.cached_llama_server().is_file() else None)
    wheel = local_model.find_xllamacpp()
    for kind, server in (("xllamacpp", wheel), ("native", native)):
        key = f"local_model_first_answer_s_{kind}"
        if server is None or local_model.find_model() is None:
            out[key] = None
            out[f"{key}_reason"] = f"no {kind} server or no model installed"
            continue
        with tempfile.TemporaryDirectory() as scratch:
            env = _env(kind, Path(server), Path(scratch))
            times = [await _once(env) for _ in range(repeats)]
        out[key] = statistics.median(times)
        runs[kind] = times
    return {**out, "_runs": {"first_answer": runs}}
