"""The core's input borders, met as a hostile client meets them: raw JSON-RPC lines on the shim's
stdin (echo backend). Every error text and preview is bounded in bytes however the input is built
(one enormous grapheme cluster, a ZWJ chain); client roots are judged as local paths before
anything is bound; a valid number is never refused nor rounded past the caller's own reading; a
fork's error names the source it was asked about."""

from __future__ import annotations

import json
from urllib.parse import unquote, urlsplit

import pytest

from harness import REPO, jsonrpc
from harness.raw import RawChannel, raw_roots_session

# Shapes a bound on characters lets through whole: one "e" with 300,000 combining accents
# (600 KB, a single grapheme cluster), a ZWJ chain of 100,000 emoji (one cluster too).
SHAPES = {
    "combining marks": "e" + "\u0301" * 300_000,
    "ZWJ chain": "\U0001F469\u200D" * 100_000 + "\U0001F469",
}
BOUND = 2000  # bytes: every error text and preview here is far below it
# Clusters still far over every preview's bound, that fit echo's 4096-token context as a prompt.
PROMPTS = {"combining marks": "e" + "\u0301" * 1500, "ZWJ chain": "\U0001F469\u200D" * 600 + "\U0001F469"}


def utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@pytest.fixture(scope="module")
def raw():
    ch = RawChannel()
    yield ch
    ch.close()


def error_text(msg: dict) -> str:
    assert msg["result"]["isError"] is True, str(msg)[:300]
    return msg["result"]["content"][0]["text"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("field", ["thread_id", "fork_from", "reasoning"])
def test_a_hostile_value_is_quoted_bounded(raw, shape, field):
    r = raw.call("respond", {"prompt": "p", field: SHAPES[shape]})
    text = error_text(r)
    assert text.startswith("invalid_argument:") and field in text, text[:300]
    assert utf8(text) < BOUND, utf8(text)


@pytest.mark.parametrize("shape", SHAPES)
def test_previews_of_a_hostile_prompt_are_bounded(raw, shape):
    tid = f"preview-{shape.replace(' ', '-')}"
    r = raw.call("respond", {"prompt": PROMPTS[shape], "thread_id": tid})
    assert not r["result"].get("isError"), str(r)[:300]
    listed = raw.call("list_threads", {})["result"]["structuredContent"]["threads"]
    [mine] = [t for t in listed if t["thread_id"] == tid]
    for key in ("first_prompt", "last_reply"):
        assert 0 < utf8(mine[key]) <= 120 and mine[key].endswith("…"), (key, utf8(mine[key]))
    # The shown part is the prompt's own beginning, cut at a scalar (one cluster is over the bound).
    assert PROMPTS[shape].startswith(mine["first_prompt"][:-1])


@pytest.mark.parametrize("shape", SHAPES)
def test_a_hostile_schema_is_quoted_bounded(raw, shape):
    schema = {"type": "object", "properties": {SHAPES[shape]: {"type": "string", "format": "nope"}}}
    text = error_text(raw.call("respond", {"prompt": "p", "schema": schema}))
    assert text.startswith("invalid_argument:") and utf8(text) < BOUND, (utf8(text), text[:200])


# --- numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize("number", [b"5e-324", b"2.2250738585072014e-308", b"2.225073858507201e-308", b"-0",
                                    b"1e-0000000000000000000001", b"0.01"])
def test_a_valid_temperature_is_never_refused(raw, number):
    raw.next_id += 1
    raw.send(b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"respond","arguments":'
             b'{"prompt":"n %s","temperature":%s}}}\n' % (raw.next_id, number, number))
    r = raw.wait(raw.next_id)
    assert not r["result"].get("isError"), r["result"]["content"][0]["text"][:300]


@pytest.mark.parametrize("number", ["19.99", "0.01", "5e-324", "2.2250738585072014e-308", "1e308", "-2.5e-320",
                                    "0.30000000000000004"])
def test_a_number_the_schema_states_comes_back_as_written(raw, number):
    # Echo answers with each number schema's `minimum`, as the schema's text wrote it: what the
    # caller gets is that number, read as its own parser reads the text, not rounded on the way.
    raw.next_id += 1
    line = (b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"respond","arguments":{"prompt":"p",'
            b'"schema":{"type":"object","properties":{"n":{"type":"number","minimum":%s}},"required":["n"]}}}}\n'
            % (raw.next_id, number.encode()))
    raw.send(line)
    r = raw.wait(raw.next_id)
    assert not r["result"].get("isError"), r["result"]["content"][0]["text"][:300]
    out = r["result"]["structuredContent"]["output"]["n"]
    assert out == json.loads(number) and repr(out) == repr(json.loads(number)), (out, number)


# --- fork_from --------------------------------------------------------------------------------


def test_a_fork_of_an_unknown_or_closed_thread_names_it(raw):
    assert not raw.call("respond", {"prompt": "p", "thread_id": "fork-closed"})["result"].get("isError")
    assert raw.call("close_thread", {"thread_id": "fork-closed"})["result"]["structuredContent"]["closed"] is True
    for source in ("fork-unknown", "fork-closed"):
        text = error_text(raw.call("respond", {"prompt": "p", "fork_from": source}))
        assert text.startswith("invalid_argument:") and f"'{source}'" in text, text[:300]


def test_a_fork_of_a_thread_lost_in_a_crash_names_it():
    ch = RawChannel()
    try:
        assert not ch.call("respond", {"prompt": "p", "thread_id": "fork-lost"})["result"].get("isError")
        ch.call("respond", {"prompt": "!crash", "thread_id": "crasher"})
        text = error_text(ch.call("respond", {"prompt": "p", "fork_from": "fork-lost"}))
        assert "'fork-lost'" in text and "lost" in text, text[:300]
    finally:
        ch.close()


# --- client roots -----------------------------------------------------------------------------


def _with_roots(uris: list[str]) -> tuple[dict, dict]:
    """A raw client offering `uris` as its roots: a call that binds tools, then a list_threads
    (was anything bound?)."""
    reply, _, listing = raw_roots_session(uris, then=jsonrpc("tools/call", {"name": "list_threads", "arguments": {}},
                                                              id=3))
    assert listing is not None
    return reply, listing


@pytest.mark.parametrize("uri, words", [
    ("file:///" + "d" * 5000, ["5001 bytes, over the system's"]),
    ("file:relative/dir", ["does not start with"]),
    ("file:///tmp/x%00y", ["NUL byte"]),
    ("file:///" + SHAPES["combining marks"], ["bytes, over the system's"]),
    ("file://elsewhere/tmp", ["does not name an absolute local path"]),
], ids=["over PATH_MAX", "relative", "NUL", "one huge cluster", "another host"])
def test_a_bad_client_root_is_refused_named_before_anything_is_bound(uri, words):
    reply, listing = _with_roots([f"file://{REPO}", uri])
    text = error_text(reply)
    assert text.startswith("invalid_argument:") and "root" in text and all(w in text for w in words), text[:300]
    assert utf8(text) < BOUND, utf8(text)
    path = unquote(urlsplit(uri).path).replace("\x00", "\\0")
    assert path[:6] in text or uri[:20] in text, text[:300]  # named: the path the core judged, or the URI
    assert listing["result"]["structuredContent"]["threads"] == [], "a refused call bound no thread"


def test_a_root_at_the_path_limit_is_taken():
    # 4095 bytes (PATH_MAX less its NUL): a path the OS could open; it need not exist.
    reply, _ = _with_roots([f"file://{REPO}", "file:///" + "d" * 4094])
    assert not reply["result"].get("isError"), error_text(reply)[:300]
