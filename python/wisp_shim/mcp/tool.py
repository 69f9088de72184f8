"""What a tool module (tools/) declares, and what its handler has to hand: `McpTool` (its name,
its declaration, its handler, and for a tool that may run as an MCP task the two steps of one),
`ToolContext` (the core and how wisp is configured), and the renderings several tools share.

mcp/server.py serves every tool in tools.TOOLS through these; no tool is known to it by name.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.types import CallToolResult, TextContent, Tool

from .. import errors
from ..core.client import Core
from ..errors import ShimError
from . import schema as output_schema

log = logging.getLogger("wisp.server")

# A client's progress callback for one call: (progress value, message).
SendProgress = Callable[[float, str], Awaitable[None]]


@dataclass(frozen=True)
class ToolContext:
    """What a tool's declaration and handler may use: the one core every session shares, and
    the live-thread cap and store wisp was started with (what retention means)."""

    core: Core
    max_threads: int
    store: str | None  # CoreLaunch.store

    def retention(self) -> str:
        """Where threads live and for how long, as configured (one wording for the server's
        instructions and the respond tool's description)."""
        if self.store is None:
            return (f"threads are kept in memory only, at most {self.max_threads} (the least recently used dropped "
                    "first), all lost when wisp restarts")
        where = ("in PostgreSQL (--store), shared by every wisp on the database," if self.store == "postgresql"
                 else "on disk (--state-dir)")
        return (
            f"threads are stored {where} and survive restarts and crashes; at most "
            f"{self.max_threads} in memory (the least recently used unloaded, resumed when next called); "
            "past --max-stored-threads the least recently written is deleted. list_threads says if the store is "
            "unusable"
        )


Handler = Callable[[ToolContext, ServerRequestContext[Any], dict[str, Any]], Awaitable[CallToolResult]]


@dataclass(frozen=True)
class TaskSteps:
    """A tool call as an MCP task runs it (mcp/tasks.py): `prepare` checks the call on its own
    channel before the handle goes out (arguments, roots); `run` runs what it prepared, with
    progress, a stop and the moment its frame is written; `thread_id` is the thread it queues on;
    `abandon` lets go of a prepared call that will not run."""

    prepare: Callable[[ToolContext, ServerRequestContext[Any], dict[str, Any]], Awaitable[Any]]
    run: Callable[[ToolContext, Any, SendProgress | None, Any, Callable[[], None] | None], Awaitable[CallToolResult]]
    thread_id: Callable[[Any], str | None]
    abandon: Callable[[Any], None]


@dataclass(frozen=True)
class McpTool:
    """One MCP tool: its name, its declaration (which may say how wisp is configured), its
    handler, and its task steps when it may run as a task."""

    name: str
    declare: Callable[[ToolContext], Tool]
    handle: Handler
    task: TaskSteps | None = None


def progress_of(ctx: ServerRequestContext[Any]) -> SendProgress | None:
    """Progress for the call this request is, when its client asked for it."""
    if not ctx.meta or ctx.meta.get("progress_token") is None:
        return None

    async def send(value: float, message: str) -> None:
        await ctx.session.report_progress(value, None, message)

    return send


def result(text: str, structured: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def output_value(text: str, thread_id: str) -> Any:
    """A structured reply's value. The core judged it (valid JSON matching the schema) before it
    kept the turn; that verdict stands, so it is not judged again here."""
    try:
        return output_schema.reply_value(text)
    except ValueError as exc:
        # Only a core bug gets here: say so, and that the turn is kept.
        log.error("the core accepted a reply that is not JSON to Python (%s): %r", exc, text[:200])
        raise ShimError(
            errors.INTERNAL,
            f"wisp's core kept a reply it judged valid but that does not parse here ({exc}); the turn is in thread "
            f"{thread_id}'s history. Please report this.",
        ) from None
