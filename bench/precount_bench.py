"""The pre-count's error: how far the tokens wisp counts for a request before sending it
are from the `prompt_tokens` llama-server reports for it, on 20 calls of mixed length (fresh
threads and threads with history, with and without instructions), SmolLM2 on llama-server.

- new: what the core counts now, the whole request by llama-server's
  `POST /v1/chat/completions/input_tokens` (its chat template and tools applied), as read from
  the core's own request through a recording proxy;
- old: what the core counted before, the sum of `/tokenize` counts (instructions, prompt, and each
  earlier turn's prompt plus its completion tokens), which misses the template's tokens.

Declares its keys, targets and table rows for run.py (as http_bench.py does).
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from typing import Any

from clients import REPO, mcp_client, wisp_argv

sys.path.insert(0, str(REPO / "tests" / "python"))
from openai_stub import RecordingProxy  # noqa: E402

PRECOUNT_TARGETS = {"precount_error_tokens_max": (1, "max")}
PRECOUNT_ROWS = [
    ("precount_error_tokens_max", "pre-count - prompt_tokens, worst of 20 (tokens)", "{:.0f}"),
    ("precount_error_tokens_max_old", "  the old count (sum of /tokenize), worst", "{:.0f}"),
    ("precount_error_tokens_mean_old", "  the old count, mean error", "{:.1f}"),
]

_WORDS = "the lighthouse keeper walked along the cliff at dawn counting gulls and waves".split()


def _text(words: int, seed: int) -> str:
    return " ".join(_WORDS[(seed + k) % len(_WORDS)] for k in range(words)) + "."


# (instructions, prompt lengths in words): 4 threads of 4 turns and 4 one-turn threads, 20 calls.
PLAN: list[tuple[str | None, list[int]]] = [
    (None, [3, 40, 8, 120]),
    ("You are a terse assistant. Answer in one short sentence.", [12, 2, 60, 25]),
    (_text(90, 3), [5, 30, 150, 1]),
    ("Reply in French.", [200, 4, 16, 70]),
    (None, [1]), (None, [300]), ("Be brief.", [20]), (_text(30, 7), [9]),
]


def _tokenize(root: str, text: str, api_key: str | None = None) -> int:
    body = json.dumps({"content": text, "add_special": False}).encode()
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    req = urllib.request.Request(root + "/tokenize", body, {"Content-Type": "application/json", **auth})
    with urllib.request.urlopen(req, timeout=30) as r:
        return len(json.loads(r.read())["tokens"])


async def measure(port: int, model: str, max_tokens: int = 8, api_key: str | None = None) -> list[dict[str, int]]:
    """Each call of PLAN through wisp (against llama-server on `port`): its new and old pre-counts
    and the prompt_tokens llama-server reported."""
    root = f"http://127.0.0.1:{port}"
    samples: list[dict[str, int]] = []
    with RecordingProxy(port, api_key=api_key) as proxy:
        async with mcp_client(wisp_argv("--endpoint", proxy.endpoint, "--model", model, backend="openai")) as c:
            for t, (instructions, lengths) in enumerate(PLAN):
                tid = None
                earlier = 0  # the old count of the turns before, as the core kept it
                for k, words in enumerate(lengths):
                    prompt = _text(words, 11 * t + k)
                    args: dict[str, Any] = {"prompt": prompt, "temperature": 0, "max_output_tokens": max_tokens}
                    if tid is None and instructions is not None:
                        args["instructions"] = instructions
                    if tid is not None:
                        args["thread_id"] = tid
                    start = len(proxy.requests)
                    res = await c.call_tool("respond", args)
                    assert not res.is_error, res
                    tid = res.structured_content["thread_id"]
                    mine = proxy.requests[start:]
                    chat = next(r for r in mine if r.path == "/v1/chat/completions")
                    chat.answered.wait(10)
                    counted = [r for r in mine if r.path == "/v1/chat/completions/input_tokens"]
                    counted[-1].answered.wait(10)
                    said = await asyncio.to_thread(_tokenize, root, prompt, api_key)
                    own = await asyncio.to_thread(_tokenize, root, instructions, api_key) if instructions else 0
                    samples.append({
                        "words": words,
                        "new": counted[-1].answer["input_tokens"],
                        "old": own + said + earlier,
                        "prompt_tokens": chat.usage["prompt_tokens"],
                    })
                    earlier += said + chat.usage["completion_tokens"]
                await c.call_tool("close_thread", {"thread_id": tid})
    return samples


def summary(samples: list[dict[str, int]]) -> dict[str, Any]:
    new = [abs(s["new"] - s["prompt_tokens"]) for s in samples]
    old = [abs(s["old"] - s["prompt_tokens"]) for s in samples]
    return {
        "precount_error_tokens_max": max(new),
        "precount_error_tokens_max_old": max(old),
        "precount_error_tokens_mean_old": sum(old) / len(old),
        "precount_calls": len(samples),
    }


async def precount_section(quick: bool, local_model_found: Any) -> dict[str, Any]:
    from wisp_shim.localmodel import local_model

    if isinstance(local_model_found, str):
        return {"precount_error_tokens_max": None, "precount_reason": local_model_found}
    binary, gguf = local_model_found
    lm = local_model.LocalModel.of(binary, gguf, api_key="", slots=1)
    await lm.ensure_running()
    try:
        samples = await measure(lm.port, lm.alias)
    finally:
        lm.stop()
    return {**summary(samples), "_runs": {"precount": samples}}
