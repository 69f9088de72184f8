"""The MCP surface: tools, their schemas and descriptions, argument checks, and the
mapping of every failure to a tool error that carries the real reason.

Built on the SDK's low-level Server: its high-level MCPServer masks plain exceptions as
"Error executing tool …", and the caller must see why a call failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
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
    Tool,
    ToolAnnotations,
)

from ..version import version
from ..core import protocol
from . import schema as output_schema
from .. import errors
from ..core.client import Core
from ..errors import ShimError
from .client_roots import client_roots
from .task_records import Job, TaskLimits
from .tasks import Tasks
from ..transport.guard import charge, json_size
from .arguments import (
    ArgumentError,
    CloseThreadArgs,
    CloseThreadOutput,
    CUT_AT_CAP_NOTE,
    DEFAULT_PAGE,
    ListThreadsArgs,
    ListThreadsOutput,
    ReadThreadArgs,
    ReadThreadOutput,
    RespondArgs,
    RespondOutput,
    ThreadEntry,
    TurnOutput,
    UsageOutput,
    UsageTotal,
    parse_args,
    short,
    tool_schema,
)

log = logging.getLogger("wisp.server")

# After tools/list, the core starts this much later (see list_tools).
LISTED_START_DELAY_S = 0.02
# Progress messages are shown to people in a status line, not read by the model.
PROGRESS_MESSAGE_CHARS = 200
# read_thread's bound on the turns' text it returns (the rest is left out, and counted).
READ_THREAD_BYTES = 32 * 1024
# list_threads' not_stored when wisp runs without a state dir.
NO_STATE_DIR = "no --state-dir was given: threads are kept in memory only and lost when wisp restarts"


def _retention(max_threads: int, state_dir: str | None) -> str:
    """Where threads live and for how long, as configured (one wording for the server's
    instructions and the respond tool's description)."""
    if state_dir is None:
        return (f"threads are kept in memory only, at most {max_threads} (the least recently used dropped first), "
                "all lost when wisp restarts")
    return (
        f"threads are stored on disk (--state-dir), so they survive wisp restarts and crashes; at most {max_threads} "
        "in memory (the least recently used unloaded, resumed from disk when next called); past --max-stored-threads "
        "the least recently written is deleted. list_threads says if the state dir is unusable"
    )


def _instructions(max_threads: int, state_dir: str | None = None) -> str:
    gone = "closed, deleted or lost" if state_dir is not None else "evicted, closed or lost"
    return (
        "wisp hands work to a local language model and keeps conversation threads with it. "
        "Call `respond` with a prompt; it returns a thread_id. Pass that thread_id back to continue "
        "the same conversation without resending earlier context. "
        f"Retention: {_retention(max_threads, state_dir)}. "
        f"A result with created=true for a thread_id you passed means no thread had it ({gone}) and a new one "
        "started. Close threads you are done with using `close_thread`."
    )


def _respond_tool(max_threads: int, state_dir: str | None = None) -> Tool:
    return Tool(
        name="respond",
        title="Ask the local model",
        description=(
            "Ask the local language model; returns its reply and a thread_id. Pass that back to continue the "
            "conversation (the model sees the earlier turns); an unknown id starts a new thread under it "
            "(created=true). instructions and tools bind at creation: passing them for an existing thread is an "
            "error, even empty. Calls on one thread run in order, threads in parallel. A thread outgrowing the "
            f"context loses its oldest turns (condensed=true). Retention: {_retention(max_threads, state_dir)}."
        ),
        input_schema=tool_schema(RespondArgs),
        output_schema=tool_schema(RespondOutput),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                    open_world_hint=False),
    )


CLOSE_THREAD = Tool(
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

LIST_THREADS = Tool(
    name="list_threads",
    title="Find threads",
    description=(
        "List or search threads (live, and stored with --state-dir): most recently used first, or best match first "
        "with query; each with a preview. Also says wisp's backend and model."
    ),
    input_schema=tool_schema(ListThreadsArgs),
    output_schema=tool_schema(ListThreadsOutput),
    annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                open_world_hint=False),
)

READ_THREAD = Tool(
    name="read_thread",
    title="Reread a thread",
    description=(
        f"A thread's instructions, tools and last turns (at most {READ_THREAD_BYTES // 1024} KB of text; says what "
        "it left out)."
    ),
    input_schema=tool_schema(ReadThreadArgs),
    output_schema=tool_schema(ReadThreadOutput),
    annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                open_world_hint=False),
)


def _error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def _output(text: str, thread_id: str) -> Any:
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


def _iso(seconds: float | None) -> str | None:
    """Unix seconds as ISO 8601 in UTC, to the second; None for none (or one out of range)."""
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return None


def _usage(u: protocol.UsageBody | None) -> UsageOutput | None:
    if u is None:
        return None
    return UsageOutput(input_tokens=u.input_tokens, output_tokens=u.output_tokens, reasoning_tokens=u.reasoning_tokens,
                       cached_tokens=u.cached_tokens, first_token_ms=u.first_token_ms,
                       output_tokens_per_s=u.output_tokens_per_s)


def _total(u: protocol.UsageBody | None) -> UsageTotal | None:
    """A sum of calls' usage: the counts only (the timings are one call's)."""
    if u is None:
        return None
    return UsageTotal(input_tokens=u.input_tokens, output_tokens=u.output_tokens, reasoning_tokens=u.reasoning_tokens,
                      cached_tokens=u.cached_tokens)


def _usage_text(u: protocol.UsageBody | None) -> str:
    """A thread's total as list_threads' text shows it: only the counts reported."""
    if u is None:
        return ""
    counts = ((u.input_tokens, "in"), (u.cached_tokens, "cached"), (u.output_tokens, "out"),
              (u.reasoning_tokens, "reasoning"))
    parts = [f"{n} {what}" for n, what in counts if n is not None]
    return f", tokens {' / '.join(parts)}" if parts else ""


def _not_stored(s: protocol.StatusResult) -> str | None:
    """Why threads are not stored: the store the core could not use, or none configured."""
    if s.state_error:
        return s.state_error
    return None if s.state_dir else NO_STATE_DIR


def _respond_content(r: protocol.RespondResult, restarted: bool) -> str:
    """The result as text; `restarted`: the call named an id this wisp had held a thread under."""
    lines = [r.text, ""]
    if r.created and restarted:
        lines.append("[note: no live thread had this id (evicted, closed or lost), so this started a new one]")
    if r.condensed:
        lines.append(f"[note: {r.dropped} older turn(s) were dropped to fit the model's context]")
    if r.finish_reason == "length":
        lines.append(CUT_AT_CAP_NOTE)
    if r.store_error:
        lines.append("[warning: this turn was answered but not stored, so a crash or restart would lose the thread: "
                     f"{r.store_error}]")
    lines.append(f"[thread_id: {r.thread_id}]")
    return "\n".join(lines)


def _progress_message(status: str, text: str) -> str:
    """What the call is doing, then as much of the partial reply as fits, its tail: the tail is
    what changed since the last notification."""
    text = " ".join(text.split())
    if not text:
        return status[:PROGRESS_MESSAGE_CHARS]
    room = PROGRESS_MESSAGE_CHARS - len(status) - 2
    if len(text) > room:
        text = "…" + text[-(room - 1):]
    return f"{status}: {text}"


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


@dataclass(frozen=True)
class _RespondCall:
    """A respond call checked and ready to run: its arguments, the client's roots, and whether
    this wisp held a thread under the id it names."""

    args: RespondArgs
    roots: list[str] | None
    knew: bool


def build_server(core: Core, max_threads: int, task_limits: TaskLimits | None = None) -> Server[Any]:
    tasks = Tasks(task_limits or TaskLimits.from_env(), core.placement)
    respond_tool = _respond_tool(max_threads, core.launch.state_dir)
    tools = [respond_tool, CLOSE_THREAD, LIST_THREADS, READ_THREAD]
    listing = ListToolsResult(tools=tools)

    async def list_tools(ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None) -> ListToolsResult:
        # The handshake is done: the core may start without slowing it (see _serve), once this
        # reply is out (starting it forks this process, which holds the loop for a moment).
        asyncio.get_running_loop().call_later(LISTED_START_DELAY_S, core.start)
        return listing

    async def respond_prepare(ctx: ServerRequestContext[Any], args: dict[str, Any]) -> _RespondCall:
        a: RespondArgs = parse_args(RespondArgs, args)
        roots = await client_roots(ctx) if a.tools or a.files else None
        if roots:
            charge(ctx.request, json_size(roots))  # held while the call runs, like its arguments
        # Asked before the call, which makes the id known: a new caller-chosen id was never lost.
        return _RespondCall(a, roots, a.thread_id is not None and core.knew(a.thread_id))

    async def respond_run(
        call: _RespondCall, send_progress: Callable[[float, str], Awaitable[None]] | None,
        stop: asyncio.Future[None] | None = None, on_sent: Callable[[], None] | None = None,
    ) -> CallToolResult:
        a, roots, knew = call.args, call.roots, call.knew
        on_progress = None
        if send_progress is not None:
            async def on_progress(count: int, status: str, text: str) -> None:
                await send_progress(float(count), _progress_message(status, text))

        checked: output_schema.CheckedSchema | None = a.output_schema
        r = await core.respond(
            a.prompt, thread_id=a.thread_id, instructions=a.instructions, tools=a.tools, files=a.files or None,
            temperature=a.temperature, max_output_tokens=a.max_output_tokens,
            on_progress=on_progress, roots=roots, schema=checked.text if checked else None, reasoning=a.reasoning,
            fork_from=a.fork_from, rewind=a.rewind,
            stop=stop, on_sent=on_sent,
        )
        # With a schema the reply is its value: `output` alone carries it.
        out = RespondOutput(
            thread_id=r.thread_id, created=r.created, text=None if checked else r.text, condensed=r.condensed,
            turns=r.turns, dropped=r.dropped, store_error=r.store_error, usage=_usage(r.usage) or UsageOutput(),
            reasoning=a.reasoning, finish_reason=r.finish_reason,
        )
        structured = out.model_dump(exclude_none=True)
        if checked is not None:
            structured["output"] = _output(r.text, r.thread_id)  # may be null
        return CallToolResult(
            content=[TextContent(type="text", text=_respond_content(r, knew))],
            structured_content=structured,
        )

    def progress_of(ctx: ServerRequestContext[Any]) -> Callable[[float, str], Awaitable[None]] | None:
        """Progress for the call this request is, when its client asked for it."""
        if not ctx.meta or ctx.meta.get("progress_token") is None:
            return None

        async def send(value: float, message: str) -> None:
            await ctx.session.report_progress(value, None, message)

        return send

    async def respond(ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
        return await respond_run(await respond_prepare(ctx, args), progress_of(ctx))

    async def close_thread(ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
        a: CloseThreadArgs = parse_args(CloseThreadArgs, args)
        r = await core.close_thread(a.thread_id)
        text = f"Closed thread {r.thread_id}." if r.closed else f"No live thread {r.thread_id} (nothing to close)."
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content=CloseThreadOutput(thread_id=r.thread_id, closed=r.closed).model_dump(),
        )

    async def list_threads(ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
        a: ListThreadsArgs = parse_args(ListThreadsArgs, args)
        s = await core.status(query=a.query, limit=a.limit or DEFAULT_PAGE, cursor=a.cursor)
        structured = ListThreadsOutput(
            backend=s.backend, model=s.model, available=s.available, context_size=s.context_size,
            max_threads=s.max_threads,
            threads=[
                ThreadEntry(
                    thread_id=t.thread_id, turns=t.turns, pending=t.pending, live=t.live, stored=t.stored,
                    usage=_total(t.usage), created_at=_iso(t.created_at), updated_at=_iso(t.updated_at),
                    first_prompt=t.first_prompt, last_reply=t.last_reply, instructions=t.instructions,
                )
                for t in s.threads
            ],
            # An empty state_dir or reason says nothing: left out, as when absent.
            state_dir=s.state_dir or None, not_stored=_not_stored(s), reason=s.reason or None,
            next_cursor=s.next_cursor,
            context_note=s.context_note, usage=_total(s.usage),
        ).model_dump(exclude_none=True)
        health = "available" if s.available else f"unavailable: {s.reason or 'unknown reason'}"
        lines = [f"backend {s.backend}, model {s.model}, {health}"]
        found = f"{len(s.threads)} thread(s) matching {a.query!r}" if a.query else f"{len(s.threads)} thread(s)"
        where = f" (threads are stored in {s.state_dir})" if s.state_dir else ""
        lines.append(found + where + (":" if s.threads else "."))
        if not_stored := structured.get("not_stored"):
            lines.append(f"threads are not stored: {not_stored}")
        if s.context_note:
            lines.append(f"context: {s.context_note}")
        if s.usage is not None:
            lines.append(f"since wisp started{_usage_text(s.usage)}")
        for t in s.threads:
            pending = f", {t.pending} call(s) pending" if t.pending else ""
            what = f"{t.turns} turn(s){pending}{_usage_text(t.usage)}{'' if t.live else ' (stored)'}"
            when = f", updated {_iso(t.updated_at)}" if t.updated_at is not None else ""
            lines.append(f"- {t.thread_id}: {what}{when}")
            if t.first_prompt is not None:
                lines.append(f"  first prompt: {t.first_prompt!r}; last reply: {t.last_reply!r}")
        if s.next_cursor:
            lines.append(f"[more: pass cursor {s.next_cursor!r}]")
        return CallToolResult(content=[TextContent(type="text", text="\n".join(lines))], structured_content=structured)

    async def read_thread(ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
        a: ReadThreadArgs = parse_args(ReadThreadArgs, args)
        r = await core.read_thread(a.thread_id, a.last, READ_THREAD_BYTES)
        structured = ReadThreadOutput(
            thread_id=r.thread_id, instructions=r.instructions, tools=r.tools, turns=r.turns, omitted=r.omitted,
            dropped=r.condensed, items=[TurnOutput(prompt=t.prompt, reply=t.reply, cut=t.cut or None) for t in r.items],
        ).model_dump(exclude_none=True)
        for item, t in zip(structured["items"], r.items):
            if t.structured:
                # The value alone (it may be null), as respond gives it.
                del item["reply"]
                item["output"] = _output(t.reply, r.thread_id)
        first = r.turns - len(r.items) + 1
        shown = f", showing {first}-{r.turns} ({r.omitted} earlier left out)" if r.omitted else ""
        lines = [f"thread {r.thread_id}: {r.turns} turn(s){shown}"]
        if r.condensed:
            lines.append(f"[{r.condensed} earlier turn(s) were condensed away]")
        lines.append(f"instructions: {r.instructions!r}" if r.instructions is not None else "no instructions")
        if r.tools:
            lines.append(f"tools: {', '.join(r.tools)}")
        for n, t in enumerate(r.items, start=first):
            lines += [f"--- turn {n}{' (shortened)' if t.cut else ''}", f"prompt: {t.prompt}", f"reply: {t.reply}"]
        return CallToolResult(content=[TextContent(type="text", text="\n".join(lines))], structured_content=structured)

    handlers = {"respond": respond, "close_thread": close_thread, "list_threads": list_threads,
                "read_thread": read_thread}

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams,
    ) -> CallToolResult | dict[str, Any]:
        handler = handlers.get(params.name)
        if handler is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {short(params.name)} (wisp has {', '.join(handlers)})")
        args = params.arguments or {}
        if (generation := tasks.wanted(ctx, params)) is not None:
            job: Job[_RespondCall] = Job(
                prepare=lambda: _as_result(params.name, respond_prepare(ctx, args)),
                run=lambda call, send, stop, on_sent: _as_result(params.name, respond_run(call, send, stop, on_sent)),
                thread_id=lambda call: call.args.thread_id,
                plain_progress=progress_of(ctx),
            )
            return await tasks.call(ctx, params, generation, job)
        return await _as_result(params.name, handler(ctx, args))

    # For the SDK's check of a 2026-07-28 HTTP call's Mcp-Param headers: without it, the SDK
    # runs list_tools (and serialises every tool) on each call to find the called tool's schema.
    input_schemas = {t.name: t.input_schema for t in tools}

    server: Server[Any] = Server(
        "wisp",
        version=version(),
        title="wisp: threads with a local model",
        instructions=_instructions(max_threads, core.launch.state_dir),
        get_tool_input_schema=input_schemas.get,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    tasks.install(server)
    return server
