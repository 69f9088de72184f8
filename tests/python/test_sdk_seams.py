"""Each seam of python/wisp_shim/transport/sdk_seams.py against the installed `mcp` SDK: an upgrade that
changes one fails here, by name. After checking the seams against a new SDK, update
sdk_seams.SDK_VERSION."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import subprocess
import sys

import pytest
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams  # the SDK's own read streams
from mcp.types import jsonrpc_message_adapter

from wisp_shim.transport import sdk_seams


def _reader_error(line: str) -> Exception:
    """What the SDK's stdio reader sends for `line` (mcp/server/stdio.py: validate_json)."""
    with pytest.raises(Exception) as caught:
        jsonrpc_message_adapter.validate_json(line, by_name=False)
    return caught.value


def test_the_sdk_is_the_version_the_seams_were_written_for():
    assert importlib.metadata.version("mcp") == sdk_seams.SDK_VERSION, (
        "the mcp SDK changed: check each seam in transport/sdk_seams.py (this file tests them), then update SDK_VERSION"
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


# sdk_imports.py: the server process imports the SDK's server side only. In a child, because
# this process has imported the SDK whole.
SERVER_SIDE_ONLY = r"""
import json, logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append(record.getMessage())
logging.basicConfig(level=logging.DEBUG, handlers=[Keep()])  # as the shim's --log-level debug
from wisp_shim import sdk_imports
took = sdk_imports.import_server_side_only()
import wisp_shim.__main__, wisp_shim.core.client, wisp_shim.mcp.server, wisp_shim.transport.stdio, wisp_shim.transport.guard
loaded = sorted(m for m in sys.modules if sys.modules[m] is not None)
import mcp.server.lowlevel.server, mcp.server.context, mcp.shared.exceptions
same = (wisp_shim.mcp.server.Server is mcp.server.lowlevel.server.Server
        and wisp_shim.mcp.server.ServerRequestContext is mcp.server.context.ServerRequestContext
        and wisp_shim.mcp.server.MCPError is mcp.shared.exceptions.MCPError)
held = "uvicorn" in sys.modules and sys.modules["uvicorn"] is None
sdk_imports.imports_done()
import uvicorn
print(json.dumps({"took": took, "loaded": loaded, "same": same, "held": held, "uvicorn": uvicorn.Server.__name__,
                  "logged": records}))
"""


def _in_child(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_server_process_imports_the_sdks_server_side_only():
    seen = _in_child(SERVER_SIDE_ONLY)
    assert seen["took"] and seen["same"] and seen["held"]
    loaded = set(seen["loaded"])
    # What the two package inits would have brought: the client side, MCPServer, the HTTP client.
    for absent in ("mcp.client", "mcp.client.session_group", "mcp.server.mcpserver", "httpx2", "uvicorn", "click"):
        assert absent not in loaded, absent
    # What the server needs is there, sse_starlette included (it takes a missing uvicorn).
    for present in ("mcp.server.lowlevel.server", "sse_starlette.sse", "mcp_types"):
        assert present in loaded, present
    # Held back only until imports_done: the HTTP server imports uvicorn after it. Meanwhile no
    # debug line says it is not installed.
    assert seen["uvicorn"] == "Server"
    assert not [m for m in seen["logged"] if "uvicorn" in m.lower()], seen["logged"]


def test_the_sdk_loads_whole_where_it_is_already_imported():
    seen = _in_child("import json, mcp\nfrom wisp_shim import sdk_imports\n"
                     "print(json.dumps({'took': sdk_imports.import_server_side_only(), 'client': hasattr(mcp, 'Client')}))")
    assert seen == {"took": False, "client": True}


def test_a_handshake_tool_result_must_be_a_call_tool_result_so_the_task_handle_is_swapped_in_after():
    from mcp_types import methods as wire
    from pydantic import ValidationError

    handle = {"task": {"taskId": "x", "status": "working", "createdAt": "2026-01-01T00:00:00Z",
                       "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 1000}}
    with pytest.raises(ValidationError):
        wire.serialize_server_result("tools/call", "2025-11-25", handle)
    assert wire.serialize_server_result("tools/call", "2025-11-25", {"content": []}) == {"content": []}


def test_a_2026_task_handle_is_not_a_core_result_type_and_passes_unchecked():
    from mcp_types import CORE_RESULT_TYPES

    assert "task" not in CORE_RESULT_TYPES and "complete" in CORE_RESULT_TYPES


def test_extensions_reach_discover_and_not_a_handshake_initialize():
    from mcp.server.lowlevel import Server
    from mcp_types import methods as wire

    server = Server("x")
    assert isinstance(server.middleware, list) and callable(server.add_request_handler)
    server.extensions["io.modelcontextprotocol/tasks"] = {}
    caps = server.get_capabilities(protocol_version="2026-07-28").model_dump(by_alias=True, exclude_none=True)
    assert caps["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    init = {"protocolVersion": "2025-11-25", "capabilities": caps, "serverInfo": {"name": "x", "version": "0"}}
    assert "extensions" not in wire.serialize_server_result("initialize", "2025-11-25", init)["capabilities"]
