"""The default model's borders, on wisp's own llama.cpp server (SmolLM2-135M, `make
local-model`) started by the shim as `make run` starts it. It remembers: over a 10-turn
conversation its read check (what the server read of each request against what was sent) must
not take a chat template's fixed overhead for a cut prompt and condense the turns away. It
cannot run away: an answer asked for without max_output_tokens stops at a share of its context,
and its result says it was cut there (`finish_reason: "length"`).

Skipped, with the reason, when the local model is not installed (WISP_REQUIRE_LOCAL_MODEL=1
makes that a failure), as test_real_model.py is.
"""

from __future__ import annotations

import sys

from harness import ok, shim_env, text_of, wisp
from harness.real_model import skip_unless_installed
from wisp_shim.localmodel import llama_server
from wisp_shim.mcp.tools.respond import CUT_AT_CAP_NOTE

if (skip := skip_unless_installed()) is not None:
    pytestmark = skip

LOCAL = {"WISP_LOCAL_MODEL": "1"} if sys.platform == "darwin" else {}
SETTINGS = {"temperature": 0, "max_output_tokens": 24}
FACT = "Remember this: the secret word is mango."
# Short turns, as a person chats: each request is mostly the chat template's own tokens.
SMALL_TALK = ["Hi.", "What is two plus two?", "Name a colour.", "Say yes.", "Name a fruit.",
              "What day follows Monday?", "Say hello.", "Name an animal."]
QUESTION = "What is the secret word?"
SYSTEM = "You are a helpful assistant."


async def _converse(instructions: str | None) -> tuple[list[dict], dict]:
    """Ten turns on one thread of the default model; each call's result, and list_threads after."""
    async with wisp(backend=None, env=shim_env(**LOCAL)) as c:
        tid, results = None, []
        for prompt in [FACT, *SMALL_TALK, QUESTION]:
            first = {"instructions": instructions} if instructions else {}
            s = ok(await c.call_tool("respond", {"prompt": prompt, **SETTINGS, **({"thread_id": tid} if tid else first)}))
            tid = s["thread_id"]
            results.append(s)
        return results, ok(await c.call_tool("list_threads", {}))


def _kept_every_turn(results: list[dict], listing: dict) -> None:
    # Far inside the 4096-token window: nothing may be condensed, nor the window "learnt" smaller.
    assert [s["turns"] for s in results] == list(range(1, 11)), [s["turns"] for s in results]
    assert not any(s["condensed"] or s["dropped"] for s in results), [(s["turns"], s["dropped"]) for s in results]
    assert listing["context_size"] == 4096 and not listing.get("context_note"), listing
    # Every request read the whole conversation: the server's own count grows turn by turn.
    read = [s["usage"]["input_tokens"] for s in results]
    assert all(b > a for a, b in zip(read, read[1:])), read


async def test_ten_short_turns_without_instructions_are_all_kept():
    # No system message: SmolLM2's template adds its own default one, tokens no byte sent
    # accounts for, which the first request's count is mostly made of.
    _kept_every_turn(*await _converse(None))


async def test_ten_turns_with_instructions_are_kept_and_the_first_is_recalled():
    results, listing = await _converse(SYSTEM)
    _kept_every_turn(results, listing)
    # A 135M model recalls a fact nine turns back only with a system message to anchor it.
    assert "mango" in results[-1]["text"].lower(), f"the model did not recall the first turn: {results[-1]['text']!r}"


async def test_an_answer_without_max_output_tokens_stops_at_a_share_of_the_context():
    context = 512
    cap = context // llama_server.OUTPUT_SHARE
    async with wisp(backend=None, env=shim_env(WISP_CONTEXT_SIZE=str(context), **LOCAL)) as c:
        r = await c.call_tool("respond", {"prompt": "Write a very long story about a dragon and a knight.", "temperature": 0})
        short = await c.call_tool("respond", {"prompt": "Say hi.", "max_output_tokens": 200, "temperature": 0})
    s = ok(r)
    # The story runs past the cap (it did to 4,060 tokens without one): the server stopped it there,
    # and the result says it was cut and how to ask for more.
    assert s["usage"]["output_tokens"] == cap, s["usage"]
    assert s["finish_reason"] == "length" and CUT_AT_CAP_NOTE in text_of(r), (s, text_of(r)[-300:])
    # A reply the model ended itself, well inside the cap, says nothing of it.
    h = ok(short)
    assert h["usage"]["output_tokens"] < cap and "finish_reason" not in h, h
