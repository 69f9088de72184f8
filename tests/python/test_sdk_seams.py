"""Each seam of python/wisp_shim/sdk_seams.py against the installed `mcp` SDK: an upgrade that
changes one fails here, by name. After checking the seams against a new SDK, update
sdk_seams.SDK_VERSION."""

from __future__ import annotations

import importlib.metadata
import inspect

import pytest
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams  # the SDK's own read streams
from mcp.types import jsonrpc_message_adapter

from wisp_shim import sdk_seams


def _reader_error(line: str) -> Exception:
    """What the SDK's stdio reader sends for `line` (mcp/server/stdio.py: validate_json)."""
    with pytest.raises(Exception) as caught:
        jsonrpc_message_adapter.validate_json(line, by_name=False)
    return caught.value


def test_the_sdk_is_the_version_the_seams_were_written_for():
    assert importlib.metadata.version("mcp") == sdk_seams.SDK_VERSION, (
        "the mcp SDK changed: check each seam in sdk_seams.py (this file tests them), then update SDK_VERSION"
    )


def test_request_key_is_the_sdks_correlation():
    assert sdk_seams.request_key("05") == sdk_seams.request_key(5) == 5
    assert sdk_seams.request_key("abc") == "abc"


@pytest.mark.parametrize("line", ["not json", '{"jsonrpc":"2.0","id":3,', "   "])
def test_a_line_that_is_not_json_reads_as_such(line):
    bad = sdk_seams.bad_line(_reader_error(line))
    assert bad is not None and bad.not_json and bad.line == line and bad.why


@pytest.mark.parametrize(
    "line, value",
    [
        ('{"jsonrpc":"2.0","id":7}', {"jsonrpc": "2.0", "id": 7}),  # no method
        ('{"id":7,"method":"x"}', {"id": 7, "method": "x"}),  # no jsonrpc
        ("[1,2]", None),
        ("5", None),
    ],
)
def test_json_that_is_no_message_reads_with_its_value(line, value):
    bad = sdk_seams.bad_line(_reader_error(line))
    assert bad is not None and not bad.not_json
    if value is not None:
        assert bad.value == value
    else:
        assert not isinstance(bad.value, dict)


def test_an_exception_without_details_says_nothing():
    assert sdk_seams.bad_line(RuntimeError("boom")) is None


def test_request_metadata_carries_both_hooks():
    async def hook() -> None:
        pass

    meta = sdk_seams.request_metadata(hook, "ctx")
    assert meta.on_request_unanswered is hook and meta.request_context == "ctx"


def test_the_sdks_read_streams_carry_last_context():
    send, receive = create_context_streams[int](1)
    assert hasattr(receive, "last_context") and sdk_seams.last_context(receive) is None
    send.close()
    receive.close()


def test_stdio_server_takes_streams_of_our_own():
    params = inspect.signature(stdio_server).parameters
    assert "stdin" in params and "stdout" in params
