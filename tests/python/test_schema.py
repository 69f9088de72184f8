"""Structured output (`respond` with `schema`) end to end through a real MCP client, shim and
core: the echo backend's contract table, the supported subset and its refusals, the OpenAI
request (response_format json_schema) and replies that are cut off or do not match (a stub
server), and the real local model when it is installed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from harness import error_text, ok, shim_env, text_of, wisp
from harness.real_model import FOUND, serve, via
from openai_stub import OpenAIStub, RecordingProxy, StubConfig
from wisp_shim.localmodel import local_model
from wisp_shim.mcp.schema import MAX_SCHEMA_BYTES

# (schema, the value the echo contract builds on a thread's first call)
ECHO_TABLE = [
    ({"const": "fixed"}, "fixed"),
    ({"type": "integer", "const": 3}, 3),
    ({"type": "string", "enum": ["error", "warning", "note"]}, "error"),
    ({"enum": [2, "two", None]}, 2),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, 1),
    ({"oneOf": [{"type": "string"}, {"type": "null"}]}, "echo 1"),
    ({"type": "string"}, "echo 1"),
    ({"type": "integer"}, 1),
    ({"type": "integer", "minimum": 7, "maximum": 9}, 7),
    ({"type": "number", "minimum": 2.5}, 2.5),
    ({"type": "number"}, 1),
    ({"type": "boolean"}, True),
    ({"type": "null"}, None),
    ({"type": "array", "items": {"type": "boolean"}}, [True]),
    ({"type": "array", "items": {"type": "string"}, "minItems": 3}, ["echo 1"] * 3),
    (
        {
            "type": "object",
            "description": "a compiler diagnostic",
            "properties": {
                "severity": {"type": "string", "enum": ["error", "warning"]},
                "line": {"type": "integer", "minimum": 1},
                "files": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                "fixed": {"type": "boolean"},
                "hint": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
            "required": ["severity", "line", "files"],
            "additionalProperties": False,
        },
        {"severity": "error", "line": 1, "files": ["echo 1"], "fixed": True, "hint": "echo 1"},
    ),
]


async def test_echo_contract_table():
    async with wisp() as c:
        for schema, expected in ECHO_TABLE:
            r = await c.call_tool("respond", {"prompt": "classify this", "schema": schema})
            s = ok(r)
            assert s["output"] == expected and "text" not in s, schema
            # The text block starts with the compact JSON text, properties in the schema's order.
            assert text_of(r).splitlines()[0] == json.dumps(expected, separators=(",", ":")), schema
            assert s["created"] and s["turns"] == 1
            jsonschema.validate(s["output"], schema)


async def test_echo_counts_turns_and_keeps_property_order():
    schema = {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}}
    async with wisp() as c:
        s1 = ok(await c.call_tool("respond", {"prompt": "one"}))
        r2 = await c.call_tool("respond", {"prompt": "two", "thread_id": s1["thread_id"], "schema": schema})
        assert text_of(r2).splitlines()[0] == '{"z":2,"a":"echo 2"}' and ok(r2)["turns"] == 2
        # The schema applies to that call only; its turn is in the history like any other.
        s3 = ok(await c.call_tool("respond", {"prompt": "three", "thread_id": s1["thread_id"]}))
        assert s3["text"] == "echo 3: three" and "output" not in s3


UNSUPPORTED = [
    ({"type": "string", "format": "date"}, "format", "#"),
    ({"type": "string", "minLength": 1}, "minLength", "#"),
    ({"type": "string", "maxLength": 9}, "maxLength", "#"),
    ({"type": "integer", "multipleOf": 2}, "multipleOf", "#"),
    ({"type": "integer", "exclusiveMinimum": 0}, "exclusiveMinimum", "#"),
    ({"type": "number", "exclusiveMaximum": 1}, "exclusiveMaximum", "#"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems", "#"),
    ({"type": "array", "items": {"type": "string"}, "contains": {"const": "a"}}, "contains", "#"),
    ({"type": "array", "prefixItems": [{"type": "string"}]}, "prefixItems", "#"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties", "#"),
    ({"type": "object", "propertyNames": {"pattern": "^a"}}, "propertyNames", "#"),
    ({"type": "object", "minProperties": 1}, "minProperties", "#"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired", "#"),
    ({"allOf": [{"type": "string"}]}, "allOf", "#"),
    ({"not": {"type": "string"}}, "not", "#"),
    ({"type": "string", "if": {"const": "a"}, "then": {"const": "a"}}, "if", "#"),
    ({"type": "string", "default": "x"}, "default", "#"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}}, "$ref", "#"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}}, "$defs", "#"),
    ({"type": "object", "properties": {"name": {"type": "string", "format": "email"}}}, "format", "#/properties/name"),
    ({"type": "array", "items": {"type": "integer", "multipleOf": 3}}, "multipleOf", "#/items"),
    ({"anyOf": [{"type": "string"}, {"type": "string", "minLength": 2}]}, "minLength", "#/anyOf/1"),
    ({"type": "string", "minimum": 1}, "minimum", "#"),  # a keyword of another type
    ({"type": "integer", "anyOf": [{"minimum": 1}]}, "type", "#"),  # anyOf takes no siblings but annotations
]


async def test_unsupported_keyword_is_refused_with_its_name_and_path():
    async with wisp() as c:
        for schema, keyword, path in UNSUPPORTED:
            msg = error_text(await c.call_tool("respond", {"prompt": "x", "schema": schema}))
            assert msg.startswith("invalid_argument:"), msg
            assert f"`{keyword}`" in msg and f"at {path} " in msg, msg
        # Refused before any model was called: no thread was created.
        assert ok(await c.call_tool("list_threads", {}))["threads"] == []


BAD = [
    ("a string", "must be a JSON object"),
    ([{"type": "string"}], "must be a JSON object"),
    ({"type": 5}, "not valid JSON Schema"),
    ({"type": "text"}, "(at #/type)"),
    ({"type": ["string", "null"]}, "use anyOf"),
    ({"description": "anything"}, "says nothing about its value"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "'b', which is not in `properties`"),
    ({"type": "object", "additionalProperties": True}, "must be false"),
    ({"type": "array"}, "without `items`"),
    ({"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 2}, "above `maxItems`"),
    ({"type": "integer", "minimum": 1.5}, "whole number"),
    ({"enum": []}, "is empty"),
    ({"enum": [True, False]}, "strings, numbers and null only"),
    ({"type": "string", "enum": ["a", 1]}, "not of the schema's type string"),
    # Judged by the core (ECMA-262, its linear engine), which names the place.
    ({"type": "string", "pattern": "^($"}, "`pattern` at # is not a regular expression wisp can use"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=x)$"}}}, "at #/properties/a"),
    ({"type": "string", "pattern": "[0-9]+"}, "start it with ^ and end it with $"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(200)}}, f"{MAX_SCHEMA_BYTES}-byte limit"),
]


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


BAD.append((_nested(40), "levels deep"))


async def test_bad_schema_is_an_invalid_argument():
    async with wisp() as c:
        for schema, says in BAD:
            msg = error_text(await c.call_tool("respond", {"prompt": "x", "schema": schema}))
            assert msg.startswith("invalid_argument:") and says in msg, msg
        assert ok(await c.call_tool("list_threads", {}))["threads"] == []


async def test_reply_that_misses_the_schema_is_invalid_output_and_leaves_history_unchanged():
    # Echo's string is "echo N", which this pattern refuses: the core's check catches it.
    digits = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[0-9]+$"}}, "required": ["code"]}
    async with wisp() as c:
        # On a new thread: no thread is left behind.
        msg = error_text(await c.call_tool("respond", {"prompt": "x", "thread_id": "t1", "schema": digits}))
        assert msg.startswith("invalid_output:") and "$.code" in msg and "^[0-9]+$" in msg, msg
        assert "max_output_tokens" in msg and "simpler schema" in msg, msg
        assert ok(await c.call_tool("list_threads", {}))["threads"] == []
        # On an existing thread: its history is as it was.
        ok(await c.call_tool("respond", {"prompt": "first", "thread_id": "t2"}))
        msg = error_text(await c.call_tool("respond", {"prompt": "x", "thread_id": "t2", "schema": digits}))
        assert msg.startswith("invalid_output:"), msg
        s = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "t2"}))
        assert s["text"] == "echo 2: again" and s["turns"] == 2


async def test_shim_trusts_the_cores_verdict(tmp_path):
    # tests/python/fake_core.py knows nothing of schemas and replies "echo N: P". The core's
    # verdict is the only one: the shim does not judge the reply again (it once did, with
    # jsonschema, and disagreed with the core on turns the core had kept). A reply that is not
    # even JSON can only be a core bug, and is reported as one.
    wrapper = tmp_path / "wisp-core"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).with_name("fake_core.py")}" "$@"\n')
    wrapper.chmod(0o755)
    async with wisp(core=str(wrapper)) as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "x", "thread_id": "t", "schema": {"type": "integer"}}))
        assert msg.startswith("internal:") and "does not parse here" in msg and "in thread t's history" in msg, msg


def openai(stub, *args: str):
    return wisp("--endpoint", stub.endpoint, *args, backend="openai", env=shim_env())


LABEL = {
    "type": "object",
    "properties": {
        "severity": {"type": "string", "enum": ["error", "warning"]},
        "count": {"type": "integer", "minimum": 0},
        "files": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["severity", "count", "files"],
    "additionalProperties": False,
}


async def test_openai_request_carries_response_format_json_schema():
    reply = '{"severity": "warning", "count": 2, "files": ["a.c", "b.h"]}'
    with OpenAIStub(StubConfig(reply=reply)) as stub:
        async with openai(stub) as c:
            r = await c.call_tool("respond", {"prompt": "classify", "schema": LABEL, "tools": ["read_file"]})
            assert ok(r)["output"] == {"severity": "warning", "count": 2, "files": ["a.c", "b.h"]}
            assert text_of(r).splitlines()[0] == reply
        (chat,) = stub.chats()
        rf = chat["response_format"]
        assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True and rf["json_schema"]["name"]
        assert rf["json_schema"]["schema"] == LABEL
        # Key order reaches the server as written: llama-server generates properties in it.
        assert list(rf["json_schema"]["schema"]["properties"]) == ["severity", "count", "files"]
        # llama-server cannot combine a schema's grammar with tools, so a schema call offers none.
        assert "tools" not in chat


async def test_openai_call_without_schema_sends_no_response_format():
    with OpenAIStub() as stub:
        async with openai(stub) as c:
            ok(await c.call_tool("respond", {"prompt": "hello"}))
        (chat,) = stub.chats()
        assert "response_format" not in chat


async def test_cut_off_reply_is_invalid_output_not_truncated_json():
    # 4 characters a token: at max_output_tokens 3 the stub stops at '{"severity": "w' with finish_reason "length".
    reply = '{"severity": "warning", "count": 2, "files": []}'
    with OpenAIStub(StubConfig(reply=reply)) as stub:
        async with openai(stub) as c:
            first = ok(await c.call_tool("respond", {"prompt": "first"}))
            tid = first["thread_id"]
            msg = error_text(await c.call_tool("respond", {"prompt": "classify", "thread_id": tid,
                                                          "schema": LABEL, "max_output_tokens": 3}))
            assert msg.startswith("invalid_output:") and "cut off" in msg and "max_output_tokens" in msg, msg
            assert '{"severity' not in msg  # the fragment is not handed back as if it were an answer
            threads = ok(await c.call_tool("list_threads", {}))["threads"]
            assert [(t["thread_id"], t["turns"]) for t in threads] == [(tid, 1)]
            ok(await c.call_tool("respond", {"prompt": "next", "thread_id": tid}))
        # The failed turn is not in the history the next request carries.
        last = stub.chats()[-1]["messages"]
        assert [m["content"] for m in last if m["role"] == "user"] == ["first", "next"]


async def test_cut_off_number_that_still_parses_is_invalid_output():
    # '1234' cut to '12' is valid JSON that matches {"type": "integer"}: only finish_reason tells.
    with OpenAIStub(StubConfig(reply="12345678")) as stub:
        async with openai(stub) as c:
            msg = error_text(await c.call_tool("respond", {"prompt": "n", "schema": {"type": "integer"}, "max_output_tokens": 1}))
            assert msg.startswith("invalid_output:") and "cut off" in msg, msg


MISMATCHES = [
    ('{"severity": "warning", "count": 2', "not valid JSON"),
    ('{"severity": "fatal", "count": 2, "files": []}', '$.severity must be one of ["error","warning"]'),
    ('{"severity": "error", "count": -1, "files": []}', "$.count must be at least 0"),
    ('{"severity": "error", "count": 1}', 'missing the required property "files"'),
    ('{"severity": "error", "count": 1, "files": [], "extra": 1}', '"extra", which the schema does not allow'),
    ('{"severity": "error", "count": 1.5, "files": []}', "$.count must be an integer"),
    ('{"severity": "error", "count": 1, "files": [3]}', "$.files[0] must be a string"),
]


async def test_reply_that_does_not_match_is_invalid_output():
    with OpenAIStub() as stub:
        async with openai(stub) as c:
            for reply, says in MISMATCHES:
                stub.config.reply = reply
                msg = error_text(await c.call_tool("respond", {"prompt": "classify", "schema": LABEL}))
                assert msg.startswith("invalid_output:") and says in msg, msg
            assert ok(await c.call_tool("list_threads", {}))["threads"] == []


# --- the real local model (SmolLM2 on llama-server), skipped when it is not installed ---------

REAL_SCHEMA = {
    "type": "object",
    "properties": {
        "severity": {"type": "string", "enum": ["error", "warning", "note"]},
        "line": {"type": "integer", "minimum": 1, "maximum": 10000},
        # Bounded as a user would bound file names: an unbounded string lets a small model ramble
        # past any output cap (seen: cut off at 200 tokens inside one string).
        "files": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9_./-]{1,40}$"}, "minItems": 1, "maxItems": 3},
    },
    "required": ["severity", "line", "files"],
    "additionalProperties": False,
}
REAL_PROMPTS = [
    "main.c:12: error: 'x' undeclared. Classify this compiler message.",
    "util.h:40: warning: unused variable 'y'. Classify this compiler message.",
    "lib/io.c:7: note: declared here. Classify this compiler message.",
    "src/app.swift:88: error: cannot find 'foo' in scope. Classify this compiler message.",
]


@pytest.mark.skipif(isinstance(FOUND, str), reason=str(FOUND))
async def test_real_model_20_calls_all_validate():
    lm = serve(local_model.DEFAULT_CONTEXT)
    try:
        with RecordingProxy(lm.port, api_key=lm.api_key) as proxy:
            async with via(proxy) as c:
                started = time.monotonic()
                for i in range(20):
                    r = await c.call_tool("respond", {"prompt": REAL_PROMPTS[i % len(REAL_PROMPTS)], "schema": REAL_SCHEMA,
                                                      "temperature": 0.7, "max_output_tokens": 512})
                    jsonschema.validate(ok(r)["output"], REAL_SCHEMA)
                    assert json.loads(text_of(r).rsplit("\n\n[", 1)[0]) == ok(r)["output"]
                print(f"\n20 structured calls in {time.monotonic() - started:.1f} s")
            assert all(b["response_format"]["type"] == "json_schema" for b in proxy.chats())
    finally:
        lm.stop()
