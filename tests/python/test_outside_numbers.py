"""Numbers from outside the core never trap it: a model server's (a scripted OpenAI-compatible
server reporting one poisoned number at a time), the pipe's and the flags'. Each poisoned number
once killed the core (on the first call, or on the second of a thread, where a running total
overflowed); now it counts as not said, and every thread keeps its turns."""

from __future__ import annotations

import json
import subprocess

import pytest

from harness import core_exchange, core_path, ok, shim_env, wisp
from openai_stub import OpenAIStub, StubConfig
from wisp_shim.core import protocol
from wisp_shim.facts import FLAG_MAXIMUMS, FLAG_MINIMUMS

BIG = str(2**63 - 1)

# (where the stub says it, the number, stub settings it needs)
POISONS = [
    ("props.n_ctx", "1e300", {}),
    ("props.total_slots", "1000000000000", {}),
    ("models.max_model_len", "1e300", {"n_ctx": None}),  # read only where /props says nothing
    ("tokenize.count", BIG, {}),
    ("input_tokens", BIG, {}),
    ("usage.prompt_tokens", BIG, {}),
    ("usage.completion_tokens", BIG, {}),
    ("usage.reasoning_tokens", BIG, {}),
]


@pytest.mark.parametrize("where,number,settings", POISONS, ids=[p[0] for p in POISONS])
async def test_a_poisoned_number_from_the_model_server_is_not_said(where, number, settings):
    with OpenAIStub(StubConfig(numbers={where: number}, **settings)) as stub:
        async with wisp("--endpoint", stub.endpoint, backend="openai", env=shim_env()) as c:
            a1 = ok(await c.call_tool("respond", {"prompt": "first of a"}))
            b1 = ok(await c.call_tool("respond", {"prompt": "first of b"}))
            a2 = ok(await c.call_tool("respond", {"prompt": "second of a", "thread_id": a1["thread_id"]}))
            b2 = ok(await c.call_tool("respond", {"prompt": "second of b", "thread_id": b1["thread_id"]}))
            listed = ok(await c.call_tool("list_threads", {}))
    assert (a2["turns"], b2["turns"]) == (2, 2), (a2, b2)
    assert a2["text"] == "reply 2: second of a" and b2["text"] == "reply 2: second of b"
    for result in (a1, b1, a2, b2, listed):
        assert BIG not in json.dumps(result), f"{where}: the server's {number} reached the caller: {result}"
    if where in ("props.n_ctx", "models.max_model_len"):
        assert listed["context_size"] == 4096  # the fallback, as for a server that says nothing
    if where == "props.total_slots":
        assert all("id_slot" not in chat for chat in stub.chats())  # no slot pool of 10^12


def _respond(id: int, **options) -> bytes:
    return protocol.encode(protocol.Respond(id=id, prompt="hi", thread_id="t", options=protocol.RespondOptions(**options)))


def test_the_pipes_max_output_tokens_is_range_checked():
    frames = core_exchange(["--backend", "echo"], _respond(1, max_output_tokens=2**63 - 1) + _respond(2, max_output_tokens=5),
                           want=(1, 2))
    by_id = {f["id"]: f for f in frames if "ok" in f}
    assert not by_id[1]["ok"] and by_id[1]["error"]["code"] == "invalid_argument", by_id[1]
    assert "max_output_tokens" in by_id[1]["error"]["message"]
    assert by_id[2]["ok"] and by_id[2]["result"]["text"] == "echo 1: hi", by_id[2]


@pytest.mark.parametrize("flag", sorted(FLAG_MINIMUMS))
def test_a_counting_flag_takes_up_to_its_maximum_and_no_more(flag):
    most = FLAG_MAXIMUMS[flag]
    refused = subprocess.run([core_path(), "--backend", "echo", flag, str(most + 1)], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=30)
    said = refused.stderr.decode()
    assert refused.returncode != 0 and flag in said and f"≤ {most}" in said, said
    frames = core_exchange(["--backend", "echo", flag, str(most)], protocol.encode(protocol.Status(id=1)))
    assert any(f.get("id") == 1 and f.get("ok") for f in frames), frames


def test_slots_are_bounded_by_what_a_server_could_hold():
    refused = subprocess.run([core_path(), "--backend", "echo", "--slots", "1025"], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=30)
    assert refused.returncode != 0 and "--slots" in refused.stderr.decode(), refused.stderr


def test_an_echo_sleep_out_of_range_fails_the_call_only():
    frames = core_exchange(["--backend", "echo", "--echo-delay-ms", "1"],
                           protocol.encode(protocol.Respond(id=1, prompt=f"!sleep {BIG} x", thread_id="s"))  # kept: tested
                           + protocol.encode(protocol.Respond(id=2, prompt="still here", thread_id="s")), want=(1, 2))
    by_id = {f["id"]: f for f in frames if "ok" in f}
    assert not by_id[1]["ok"] and by_id[1]["error"]["code"] == "invalid_argument", by_id[1]
    assert by_id[2]["ok"] and by_id[2]["result"]["text"] == "echo 1: still here", by_id[2]
