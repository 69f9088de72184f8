"""One verdict, taken once, on exact data, end to end through the shim and the real core (echo backend unless said):

- a structured reply is judged by the core alone, before the turn is kept: big integers, NFC
  and NFD keys and `$` before a final newline no longer make the caller hear "failed" about a
  turn that was kept;
- odd schemas and schemas that imply a huge value are `invalid_argument` naming the place;
- a reply over the pipe's frame limit once encoded is `reply_too_large`, its turn not kept;
- a call whose reply is costly to check holds up no call on another thread, and stops when
  its time limit comes.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import psutil
from harness import (INITIALIZE, INITIALIZED, call, core_exchange, cpu_s, error_text, ok, read_until, shim_env, spawn, text_of,
                     wait_for, wisp)
from openai_stub import OpenAIStub, StubConfig

NFC, NFD = "caf\u00e9", "cafe\u0301"


async def test_a_big_integer_const_is_kept_exactly_and_the_turn_with_it():
    # Once rounded through a Double (…992) in the core, so the shim's second check failed a kept turn.
    async with wisp() as c:
        r = await c.call_tool("respond", {"prompt": "n", "thread_id": "t", "schema": {"const": 9007199254740993}})
        assert text_of(r).splitlines()[0] == "9007199254740993" and ok(r)["output"] == 9007199254740993
        r = await c.call_tool("respond", {"prompt": "n", "thread_id": "t", "schema": {"type": "integer", "minimum": 1700000000000000001}})
        assert text_of(r).splitlines()[0] == "1700000000000000001" and ok(r)["turns"] == 2
        assert ok(await c.call_tool("respond", {"prompt": "next", "thread_id": "t"}))["text"] == "echo 3: next"


async def test_nfc_and_nfd_property_names_are_two_properties():
    schema = {"type": "object", "properties": {NFC: {"type": "integer"}, NFD: {"type": "string"}},
              "required": [NFC, NFD], "additionalProperties": False}
    async with wisp() as c:
        r = await c.call_tool("respond", {"prompt": "x", "thread_id": "t", "schema": schema})
        assert ok(r)["output"] == {NFC: 1, NFD: "echo 1"}
        assert list(json.loads(text_of(r).splitlines()[0])) == [NFC, NFD]


def openai(stub, *args: str):
    return wisp("--endpoint", stub.endpoint, *args, backend="openai", env=shim_env())


async def test_patterns_are_ecma_on_code_points_and_a_failed_turn_is_not_kept():
    # ECMA-262 (JSON Schema's regex dialect): "abc\n" does not match ^abc$. Python's re says it
    # does; the core once said so too, kept the turn, and the shim then answered invalid_output.
    schema = {"type": "string", "pattern": "^abc$"}
    with OpenAIStub(StubConfig(reply="first")) as stub:
        async with openai(stub) as c:
            tid = ok(await c.call_tool("respond", {"prompt": "one"}))["thread_id"]
            stub.config.reply = json.dumps("abc\n")
            msg = error_text(await c.call_tool("respond", {"prompt": "two", "thread_id": tid, "schema": schema}))
            assert msg.startswith("invalid_output:") and "^abc$" in msg and "not added" in msg, msg
            stub.config.reply = json.dumps("abc")
            s = ok(await c.call_tool("respond", {"prompt": "three", "thread_id": tid, "schema": schema}))
            assert s["output"] == "abc" and s["turns"] == 2
            # `.` is one code point, not a grapheme cluster: "e" + U+0301 is two (the core's
            # Swift Regex once took it as one, kept the turn, and the shim said invalid_output).
            stub.config.reply = json.dumps("e\u0301")
            msg = error_text(await c.call_tool("respond", {"prompt": "four", "thread_id": tid,
                                                          "schema": {"type": "string", "pattern": "^.$"}}))
            assert msg.startswith("invalid_output:") and "not added" in msg, msg
            ok(await c.call_tool("respond", {"prompt": "five", "thread_id": tid}))
        last = stub.chats()[-1]["messages"]
        assert [m["content"] for m in last if m["role"] == "user"] == ["one", "three", "five"]


def _nested(levels: int, leaf: dict, **each) -> dict:
    schema = leaf
    for _ in range(levels):
        schema = {"type": "array", "items": schema, **each}
    return schema


ODD = [
    ({"$schema": 5, "type": "string"}, "#/$schema"),
    ({"$schema": {}, "type": "string"}, "#/$schema"),
    (_nested(150, {"type": "string"}), "levels deep"),
    ({"type": "array", "items": {"type": "string"}, "minItems": 2**40}, f"`minItems` at # is {2**40}, over wisp's bound of 10000"),
    (_nested(8, {"type": "string"}, minItems=10), "`minItems` at # makes the value this schema asks for at least"),
    ({"type": "object", "properties": {"a": _nested(3, {"type": "string"}, minItems=200)}}, "`minItems` at #/properties/a makes"),
    ({"type": "integer", "minimum": 10**400}, "the number at #/minimum has 401 digits"),
]


async def test_odd_schemas_are_argument_errors_naming_the_place():
    async with wisp() as c:
        for schema, says in ODD:
            msg = error_text(await c.call_tool("respond", {"prompt": "x", "schema": schema}))
            assert msg.startswith("invalid_argument:") and says in msg, msg
        assert ok(await c.call_tool("list_threads", {}))["threads"] == []
        # The core is the one it was: nothing crashed.
        assert ok(await c.call_tool("respond", {"prompt": "still", "thread_id": "s"}))["text"] == "echo 1: still"


def test_a_number_beyond_a_double_in_a_schema_is_an_argument_error():
    # 1e400 reaches the shim as Python's float('inf'): once an `internal` error.
    proc = spawn()
    lines: list[bytes] = []
    try:
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        read_until(proc, 1, lines)
        raw = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"respond","arguments":' \
              b'{"prompt":"x","schema":{"type":"object","properties":{"n":{"type":"integer","minimum":1e400}}}}}}\n'
        proc.stdin.write(INITIALIZED + raw + call("respond", {"prompt": "after"}, 3))
        proc.stdin.flush()
        r = read_until(proc, 2, lines)["result"]
        text = r["content"][0]["text"]
        assert r["isError"] and text.startswith("invalid_argument:") and "#/properties/n/minimum" in text, text
        assert read_until(proc, 3, lines)["result"]["content"][0]["text"].startswith("echo 1: after")
    finally:
        proc.kill()
        proc.wait()


async def test_a_reply_too_large_once_encoded_fails_before_its_turn_is_kept(tmp_path):
    # 9 MB of '"' is 18 MB once JSON-escaped: over the pipe's 16 MiB frame limit.
    (tmp_path / "quotes.txt").write_bytes(b'"' * (9 * 1024 * 1024))
    async with wisp("--root", str(tmp_path), "--context-size", "20000000") as c:
        ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))
        msg = error_text(await c.call_tool("respond", {"prompt": "two", "thread_id": "t", "files": ["quotes.txt"]}))
        assert msg.startswith("reply_too_large:") and "16777216" in msg and "not added" in msg, msg
        assert ok(await c.call_tool("respond", {"prompt": "three", "thread_id": "t"}))["text"] == "echo 2: three"
        # A reply of '/' is not escaped: 9 MB stays 9 MB and is delivered.
        (tmp_path / "slashes.txt").write_bytes(b"/" * (9 * 1024 * 1024))
        s = ok(await c.call_tool("respond", {"prompt": "four", "thread_id": "t", "files": ["slashes.txt"]}))
        assert s["turns"] == 3 and s["text"].endswith("/" * 1000)


# A reply that is cheap to build and costly to check (seconds): 10,000 strings against a pattern
# of ~10,000 states (the linear engine's cost is text length x states).
COSTLY = {"type": "array", "minItems": 10000, "items": {"type": "string", "pattern": "^" + "(.?){1000}" * 5 + "echo 1$"}}


async def _quick_latencies(c, n: int) -> list[float]:
    out = []
    for k in range(n):
        started = time.perf_counter()
        ok(await c.call_tool("respond", {"prompt": f"q{k}", "thread_id": "quick"}))
        out.append(time.perf_counter() - started)
    return out


def _core(c) -> psutil.Process:
    from harness import core_pids

    (pid,) = core_pids(c)
    return psutil.Process(pid)


async def test_a_costly_reply_check_holds_up_no_other_thread_and_stops_at_its_time_limit():
    async with wisp("--timeout", "2", "--context-size", "1000000") as c:
        await _quick_latencies(c, 5)  # warm
        core = _core(c)
        cpu0 = cpu_s(core)
        alone = statistics.median(await _quick_latencies(c, 20))
        cpu1, t1 = cpu_s(core), time.monotonic()
        quick_cpu = cpu1 - cpu0  # what 20 quick calls cost the core
        hostile = asyncio.create_task(c.call_tool("respond", {"prompt": "x", "thread_id": "h", "schema": COSTLY}))
        # The check is under way once the core burns CPU on it.
        await wait_for(lambda: cpu_s(core) - cpu1 > 0.05, 10, "the costly check never started")
        during = statistics.median(await _quick_latencies(c, 20))
        r = await hostile
        assert r.is_error and text_of(r).startswith("timeout:"), text_of(r)[:300]
        # Proof that the quick calls ran beside the check, not before or after it: the core spent
        # far more than the quick calls cost while the hostile call was open. The bound is a
        # fraction of one CPU for its 2 s so that a CI machine shared with other jobs passes.
        busy = cpu_s(core) - cpu1 - quick_cpu
        span = time.monotonic() - t1
        assert busy > 0.4, f"the costly check was not running meanwhile ({busy:.3f} s of CPU in {span:.1f} s)"
        # Within 0.5 s of its time limit the core is idle again: the check stopped.
        await asyncio.sleep(0.5)  # kept, as the next: the time after the limit is the thing tested
        cpu2 = cpu_s(core)
        await asyncio.sleep(1.0)
        idle = cpu_s(core) - cpu2
        print(f"\nquick call p50 alone {alone * 1000:.1f} ms, during the costly check {during * 1000:.1f} ms; "
              f"core CPU: {busy:.3f} s for the check in {span:.1f} s (20 quick calls alone: {quick_cpu:.3f} s), "
              f"{idle:.3f} s in the second from 0.5 s after the limit")
        # Generous for a shared 2-vCPU machine; the real figures are in the print and the README.
        assert during <= alone + 0.25, (alone, during)
        assert idle < 0.1, idle
        assert ok(await c.call_tool("respond", {"prompt": "after", "thread_id": "h"}))["text"] == "echo 1: after"


def test_the_core_refuses_a_huge_schema_it_is_sent_without_the_shim():
    # Defence in depth: the shim's bounds are the judge, but a core sent such a schema anyway
    # answers invalid_argument (minItems 2^40 once aborted it, 10^8 strings took it down).
    from wisp_shim.core import protocol

    huge = json.dumps({"type": "array", "items": {"type": "string"}, "minItems": 2**40})
    deep = json.dumps(_nested(8, {"type": "string"}, minItems=10))
    frames = b"".join(protocol.frame(json.dumps({"op": "respond", "id": i, "prompt": "x", "schema": s}).encode()) for i, s in ((1, huge), (2, deep)))
    frames += protocol.frame(b'{"op":"ping","id":3}')
    replies = {f.get("id"): f for f in core_exchange(["--backend", "echo"], frames, want=(1, 2, 3))}
    for i in (1, 2):
        assert replies[i]["ok"] is False and replies[i]["error"]["code"] == "invalid_argument", replies[i]
        assert "minItems" in replies[i]["error"]["message"], replies[i]
    assert replies[3]["ok"] is True


# (schema, the model's reply, served): served replies must reach the caller as values that
# validate against the schema as the caller's parser reads both; the others are invalid_output.
NUMBERS_AS_READ = [
    # Every parser reads the reply and the const as 0.3 (judged as written, it was refused).
    ({"const": 0.30000000000000001}, "0.30000000000000001", True),
    ({"type": "number", "minimum": 1e-400}, "1e-400", True),
    # Infinity to every parser (the caller once got null).
    ({"type": "object", "properties": {"n": {"type": "number"}}}, '{"n":1e400}', False),
    # 1.0 to every parser, which matches both branches (the caller once got 1.0).
    ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 1}]}, "1.0000000000000001", False),
    # 2^53 + 1: one branch to Python, both (2^53) to JavaScript.
    ({"oneOf": [{"const": 9007199254740993}, {"const": 9007199254740992}]}, "9007199254740993", False),
    ({"type": "integer", "minimum": 9007199254740993}, "9007199254740993", True),
]


def _valid_as_read(schema: dict, value, *, javascript: bool) -> bool:
    """Whether `value`, written out as the shim writes it and read back as the caller's parser
    reads it, validates against `schema` read the same way."""
    import jsonschema

    parse = {"parse_int": float} if javascript else {}
    read = json.loads(json.dumps(value), **parse)
    return jsonschema.Draft202012Validator(json.loads(json.dumps(schema), **parse)).is_valid(read)


async def test_numbers_reach_the_caller_as_they_were_judged():
    with OpenAIStub(StubConfig(reply="first")) as stub:
        async with openai(stub) as c:
            turns = ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))["turns"]
            for schema, reply, served in NUMBERS_AS_READ:
                stub.config.reply = reply
                result = await c.call_tool("respond", {"prompt": "n", "thread_id": "t", "schema": schema})
                if served:
                    s = ok(result)
                    turns += 1
                    # A structured reply is said once, as `output` (the text block carries its JSON).
                    assert "text" not in s and s["turns"] == turns, (schema, s)
                    for javascript in (False, True):
                        assert _valid_as_read(schema, s["output"], javascript=javascript), (schema, reply, s["output"])
                else:
                    msg = error_text(result)
                    assert msg.startswith("invalid_output:") and "not added" in msg, (schema, reply, msg)
            listing = ok(await c.call_tool("list_threads", {}))
            assert [t["turns"] for t in listing["threads"]] == [turns]
