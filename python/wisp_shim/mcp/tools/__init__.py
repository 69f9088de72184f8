"""wisp's MCP tools, one module each: its arguments and output models, its declaration and its
handler. TOOLS is the one list of them: tools/list shows them in this order, and mcp/server.py
serves each by its name."""

from __future__ import annotations

from ..tool import McpTool
from . import close_thread, list_threads, read_thread, respond

TOOLS: tuple[McpTool, ...] = (respond.TOOL, close_thread.TOOL, list_threads.TOOL, read_thread.TOOL)
