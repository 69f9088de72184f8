"""`close_thread`: forget a thread and free its memory."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.context import ServerRequestContext
from mcp.types import CallToolResult, Tool, ToolAnnotations
from pydantic import BaseModel, Field

from ..models import Arguments, ErrorWording, ThreadId, parse_args, tool_schema
from ..tool import McpTool, ToolContext, result


class CloseThreadArgs(Arguments):
    thread_id: Annotated[ThreadId, ErrorWording("a string", required="`thread_id` is required.")] = Field(
        description="The thread to close.")


class CloseThreadOutput(BaseModel):
    thread_id: str = Field(description="The thread named.")
    closed: bool = Field(description="True when a live thread was closed.")


def declare(tc: ToolContext) -> Tool:
    return Tool(
        name="close_thread",
        title="Close a thread",
        description=(
            "Forget a thread and free its memory. An unknown or already closed thread is no error (closed=false). A "
            "call already running on it still finishes."
        ),
        input_schema=tool_schema(CloseThreadArgs),
        output_schema=tool_schema(CloseThreadOutput),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                    open_world_hint=False),
    )


async def handle(tc: ToolContext, ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
    a: CloseThreadArgs = parse_args(CloseThreadArgs, args)
    r = await tc.core.close_thread(a.thread_id)
    text = f"Closed thread {r.thread_id}." if r.closed else f"No live thread {r.thread_id} (nothing to close)."
    return result(text, CloseThreadOutput(thread_id=r.thread_id, closed=r.closed).model_dump())


TOOL = McpTool("close_thread", declare, handle)
