"""The MCP surface's server: every tool in tools.TOOLS listed and served, every failure mapped to
a tool error that carries the real reason, and `respond` handed to mcp/tasks.py when a call asks to
run as a task. Each tool (its models, declaration and handler) is its own module in tools/.

Built on the SDK's low-level Server: its high-level MCPServer masks plain exceptions as
"Error executing tool …", and the caller must see why a call failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
)

from .. import errors
from ..core.client import Core
from ..errors import ShimError, short
from ..version import version
from .models import ArgumentError
from .task_records import Job, TaskLimits
from .tasks import Tasks
from .tool import ToolContext, progress_of
from .tools import TOOLS

log = logging.getLogger("wisp.server")

# After tools/list, the core starts this much later (see list_tools).
LISTED_START_DELAY_S = 0.02


def _instructions(tc: ToolContext) -> str:
    gone = "closed, deleted or lost" if tc.store is not None else "evicted, closed or lost"
    return (
        "wisp hands work to a local language model and keeps conversation threads with it. "
        "Call `respond` with a prompt; it returns a thread_id. Pass that thread_id back to continue "
        "the same conversation without resending earlier context. "
        f"Retention: {tc.retention()}. "
        f"A result with created=true for a thread_id you passed means no thread had it ({gone}) and a new one "
        "started. Close threads you are done with using `close_thread`."
    )


def _error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


async def _as_result(name: str, work: Awaitable[Any]) -> Any:
    """A tool's outcome as its caller sees it: every failure a tool error that carries the real reason."""
    try:
        return await work
    except ArgumentError as exc:
        return _error(f"{errors.INVALID_ARGUMENT}: {exc}")
    except ShimError as exc:
        return _error(str(exc))
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        # Anything else is a bug in wisp; the caller still gets a tool error, not a silent failure.
        log.exception("tool %s failed", name)
        return _error(
            f"{errors.INTERNAL}: wisp failed unexpectedly ({type(exc).__name__}: {exc}); see its log on stderr."
        )


def build_server(core: Core, max_threads: int, task_limits: TaskLimits | None = None) -> Server[Any]:
    tc = ToolContext(core, max_threads, core.launch.store)
    by_name = {t.name: t for t in TOOLS}
    tasks = Tasks(task_limits or TaskLimits.from_env(), core.placement,
                  frozenset(t.name for t in TOOLS if t.task is not None))
    declared = [t.declare(tc) for t in TOOLS]
    listing = ListToolsResult(tools=declared)

    async def list_tools(ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None) -> ListToolsResult:
        # The handshake is done: the core may start without slowing it (see _serve), once this
        # reply is out (starting it forks this process, which holds the loop for a moment).
        asyncio.get_running_loop().call_later(LISTED_START_DELAY_S, core.start)
        return listing

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams,
    ) -> CallToolResult | dict[str, Any]:
        tool = by_name.get(params.name)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {short(params.name)} (wisp has {', '.join(by_name)})")
        args = params.arguments or {}
        if (generation := tasks.wanted(ctx, params)) is not None:
            steps = tool.task
            assert steps is not None  # tasks.wanted takes only the tools with task steps
            job: Job[Any] = Job(
                prepare=lambda: _as_result(params.name, steps.prepare(tc, ctx, args)),
                run=lambda call, send, stop, on_sent: _as_result(params.name, steps.run(tc, call, send, stop, on_sent)),
                thread_id=steps.thread_id,
                abandon=steps.abandon,
                plain_progress=progress_of(ctx),
            )
            return await tasks.call(ctx, params, generation, job)
        return await _as_result(params.name, tool.handle(tc, ctx, args))

    # For the SDK's check of a 2026-07-28 HTTP call's Mcp-Param headers: without it, the SDK
    # runs list_tools (and serialises every tool) on each call to find the called tool's schema.
    input_schemas = {t.name: t.input_schema for t in declared}

    server: Server[Any] = Server(
        "wisp",
        version=version(),
        title="wisp: threads with a local model",
        instructions=_instructions(tc),
        get_tool_input_schema=input_schemas.get,
        on_list_tools=list_tools,
        # A legacy task's call answers a dict, the handle its middleware sends (mcp/tasks.py).
        on_call_tool=call_tool,  # type: ignore[arg-type]
    )
    tasks.install(server)
    return server
