"""The baseline for `make bench`: a bare MCP stdio server on the same `mcp` SDK as wisp,
whose one tool returns its input.

    python bench/baseline_server.py [--wisp-stdio]

It is built the way wisp's shim is (the SDK's low-level `Server`, a tool with an input and
an output schema, a result with both text content and structuredContent), so that
wisp ÷ baseline isolates what wisp adds: its own code, the pipe and the core. The SDK's
high-level MCPServer would be slower (per-call pydantic models) and so a softer baseline.

With --wisp-stdio it serves over wisp's own stdio transport (python/wisp_shim/transport/stdio.py: the
SDK's, on asyncio pipes instead of worker threads), so that wisp ÷ this isolates what wisp's
threads, pipe and core add with the transport gain taken out.

With --http it serves MCP's streamable HTTP as the SDK ships it (`Server.streamable_http_app`,
its own DNS rebinding protection on 127.0.0.1) under uvicorn, configured as `wisp --http` runs it,
on a free port of 127.0.0.1 that it prints on stdout (`port N`): the baseline of bench/http_bench.py.
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
    description="Return the prompt unchanged (after MS milliseconds for a prompt `!sleep MS ...`).",
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
    if prompt.startswith("!sleep "):
        # Like wisp's echo backend: the concurrency benchmark's calls wait, then answer.
        await anyio.sleep(int(prompt.split()[1]) / 1000)
    return CallToolResult(content=[TextContent(type="text", text=prompt)], structured_content={"text": prompt})


async def serve_http(server: Server[Any]) -> None:
    import socket

    import uvicorn

    # IPPROTO_TCP so that asyncio turns Nagle off on its connections, as wisp's own listen() does.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(socket.SOMAXCONN)
    print(f"port {sock.getsockname()[1]}", flush=True)
    app = server.streamable_http_app(host="127.0.0.1")
    await uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", server_header=False)).serve(sockets=[sock])


async def main() -> None:
    server = Server("baseline", version="0", on_list_tools=list_tools, on_call_tool=call_tool)
    if "--http" in sys.argv[1:]:
        await serve_http(server)
        return
    serve = stdio_server
    if "--wisp-stdio" in sys.argv[1:]:
        from wisp_shim.transport.stdio import stdio_server as serve
    async with serve() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
