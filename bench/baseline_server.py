"""The baseline for `make bench`: a bare MCP stdio server on the same `mcp` SDK as wisp,
whose one tool returns its input.

    python bench/baseline_server.py

It is built the way wisp's shim is (the SDK's low-level `Server`, a tool with an input and
an output schema, a result with both text content and structuredContent), so that
wisp ÷ baseline isolates what wisp adds: its own code, the pipe and the core. The SDK's
high-level MCPServer would be slower (per-call pydantic models) and so a softer baseline.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)

RESPOND = Tool(
    name="respond",
    description="Return the prompt unchanged.",
    input_schema={
        "type": "object",
        "properties": {
            "prompt": {"type": "string", "description": "Any text."},
            "thread_id": {"type": "string", "description": "Ignored."},
        },
        "required": ["prompt"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
)


async def list_tools(ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None) -> ListToolsResult:
    return ListToolsResult(tools=[RESPOND])


async def call_tool(ctx: ServerRequestContext[Any], params: CallToolRequestParams) -> CallToolResult:
    prompt = str((params.arguments or {}).get("prompt", ""))
    return CallToolResult(content=[TextContent(type="text", text=prompt)], structured_content={"text": prompt})


async def main() -> None:
    server = Server("baseline", version="0", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
