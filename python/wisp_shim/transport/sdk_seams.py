"""What wisp takes from the `mcp` SDK beyond its documented API, in one place. Written for
mcp 2.3.0 (SDK_VERSION); tests/python/test_sdk_seams.py checks each seam against the installed
SDK, so an upgrade that changes one fails there, by name, rather than as a hang or a silent
misreading somewhere else.

- request_key: how the SDK correlates request ids (`mcp.shared.dispatcher.coerce_request_id`:
  "05" and 5 are one id). The transport's budget, transport/request_ids.py's in-flight check and cancels key
  ids the same.
- bad_line: what the SDK's stdio reader puts on its read stream for a line it cannot take: the
  pydantic ValidationError of `mcp.types.jsonrpc_message_adapter.validate_json`, whose details
  tell a line that is not JSON (`json_invalid`, the line as input) from JSON that is no JSON-RPC
  message (a `missing` field at depth 2, or an error at the root, the value as input).
- request_metadata: the per-message hooks of `ServerMessageMetadata` by which the SDK says that
  a request ended without a reply (`on_request_unanswered`) and hands the handler the
  transport's own context (`request_context`, the handler's `ctx.request`).
- last_context: the SDK's read streams carry the sender's contextvars (`last_context`); a
  stream that wraps one must pass it on.
- transport/stdio.py feeds the SDK's `stdio_server(stdin=, stdout=)` objects that are not anyio files, only
  their `async for` / `write` / `flush`.
- mcp/tasks.py, on the low-level Server: `add_request_handler` for `tasks/*` (methods the SDK does
  not know reach their handler in both eras); `Server.middleware`, whose entries wrap a
  handler's result after the era's check of it, which for a 2025-11-25 `tools/call` is
  CallToolResult (so the task handle is swapped in there; the handler runs in the middleware's
  asyncio task, so a context variable set there reaches it); a 2026-07-28 result whose
  `resultType` is not a core one passes that check unchanged; `Server.extensions` is advertised
  by `server/discover` and dropped from a 2025-11-25 `initialize`; `ctx.request` is the HTTP
  request (its headers) over streamable HTTP.
- sdk_imports.py (apart, because it must run before anything imports the SDK): the server
  process loads `mcp` and `mcp.server` as bare packages, skipping their `__init__` (the client
  side, MCPServer), and holds uvicorn back until its imports are done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import ServerMessageMetadata

SDK_VERSION = "2.3.0"


def request_key(request_id: Any) -> Any:
    """The id as the SDK correlates it."""
    return coerce_request_id(request_id)


@dataclass(frozen=True)
class BadLine:
    """A line the SDK's stdio reader could not take as a JSON-RPC message."""

    # The line is not JSON at all (else it is JSON, but no JSON-RPC message).
    not_json: bool
    # not_json: the line as read, and the parser's reason.
    line: str | None = None
    why: str = "invalid JSON"
    # Not a JSON-RPC message: the value the line holds, when the SDK reports it.
    value: Any = None


def bad_line(exc: Exception) -> BadLine | None:
    """What the exception the SDK's reader sent says about the line; None when it says nothing
    (not a validation error)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return None
    try:
        details: list[dict[str, Any]] = list(errors())
    except Exception:
        return None
    for d in details:
        if d.get("type") == "json_invalid":
            raw = d.get("input")
            why = (d.get("ctx") or {}).get("error") or d.get("msg") or "invalid JSON"
            return BadLine(not_json=True, line=raw if isinstance(raw, str) else None, why=why)
    # A `missing` field error's input is the object that lacks it: here, the message.
    value = next((d.get("input") for d in details if d.get("type") == "missing" and len(d.get("loc", ())) == 2), None)
    if value is None:
        value = next((d.get("input") for d in details if d.get("loc") == ()), None)
    return BadLine(not_json=False, value=value)


def request_metadata(on_unanswered: Any, context: Any) -> ServerMessageMetadata:
    """Metadata for a request handed to the SDK: `on_unanswered` is awaited if the request ends
    without a reply; `context` is what the handler sees as `ctx.request`."""
    return ServerMessageMetadata(on_request_unanswered=on_unanswered, request_context=context)


def last_context(stream: Any) -> Any:
    """The sender's context of the last item the SDK's read stream gave."""
    return getattr(stream, "last_context", None)
