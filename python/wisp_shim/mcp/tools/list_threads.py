"""`list_threads`: list or search threads, live and stored, and say wisp's backend and model."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from mcp.server.context import ServerRequestContext
from mcp.types import CallToolResult, Tool, ToolAnnotations
from pydantic import BaseModel, Field

from ...core import protocol
from ...facts import MAX_QUERY_BYTES
from ..models import Arguments, ErrorWording, parse_args, tool_schema
from ..tool import McpTool, ToolContext, result

# The page size when the caller names none, and the most it may name.
DEFAULT_PAGE = 20
MAX_PAGE = 100
# not_stored when wisp runs without a store.
NO_STATE_DIR = "no --state-dir or --store was given: threads are kept in memory only and lost when wisp restarts"


class ListThreadsArgs(Arguments):
    # Its length and its words are the core's to judge (in bytes): a schema maxLength would count characters.
    query: Annotated[str | None, ErrorWording("a string")] = Field(
        None,
        description=f"Words to find in prompts and replies (at most {MAX_QUERY_BYTES} bytes of UTF-8); best first.",
    )
    limit: Annotated[int | None, ErrorWording(f"an integer from 1 to {MAX_PAGE}")] = Field(
        None, ge=1, le=MAX_PAGE, description=f"Threads per page (default {DEFAULT_PAGE}).",
    )
    cursor: Annotated[str | None, ErrorWording("a string")] = Field(None, description="next_cursor of the page before.")


# Counts summed over calls, each as respond's `usage` describes it: described there once, since
# every client reads tools/list whole on every session (and a docstring here would be the schema's).
class UsageTotal(BaseModel):
    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None


class ThreadEntry(BaseModel):
    thread_id: str
    turns: int
    pending: int = Field(description="Calls running or waiting on it.")
    live: bool = Field(description="In memory now.")
    stored: bool = Field(description="In the store (--state-dir or --store).")
    created_at: str | None = Field(None, description="ISO 8601, UTC; where known.")
    updated_at: str | None = Field(None, description="ISO 8601, UTC; its last turn.")
    first_prompt: str | None = Field(None, description="The start of its first prompt.")
    last_reply: str | None = Field(None, description="The start of its last reply.")
    instructions: str | None = Field(None, description="Its instructions, shortened.")
    usage: UsageTotal | None = Field(None, description="Live threads: their calls' usage since created or resumed.")


class ListThreadsOutput(BaseModel):
    backend: str = Field(description="apple, openai or echo.")
    model: str
    available: bool = Field(description="True when the model can answer now.")
    reason: str | None = Field(None, description="Why not, when it cannot.")
    context_size: int = Field(description="The model's context window in tokens.")
    max_threads: int = Field(description="Live threads kept at most.")
    state_dir: str | None = Field(None, description="Where threads are stored, when they are.")
    not_stored: str | None = Field(
        None, description="Why threads are not stored: no store given, or why it is unusable.")
    context_note: str | None = Field(
        None, description="When the server was found to cut prompts: the window wisp now uses.")
    usage: UsageTotal | None = Field(None, description="Every call's usage since wisp started, summed.")
    threads: list[ThreadEntry]
    next_cursor: str | None = Field(None, description="The next page's cursor; absent on the last.")


def declare(tc: ToolContext) -> Tool:
    return Tool(
        name="list_threads",
        title="Find threads",
        description=(
            "List or search threads (live, and stored with --state-dir or --store): most recently used first, or best match "
            "first with query; each with a preview. Also says wisp's backend and model."
        ),
        input_schema=tool_schema(ListThreadsArgs),
        output_schema=tool_schema(ListThreadsOutput),
        annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                    open_world_hint=False),
    )


async def handle(tc: ToolContext, ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
    a: ListThreadsArgs = parse_args(ListThreadsArgs, args)
    s = await tc.core.status(query=a.query, limit=a.limit or DEFAULT_PAGE, cursor=a.cursor)
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
        state_dir=s.store_location or None, not_stored=_not_stored(s), reason=s.reason or None,
        next_cursor=s.next_cursor,
        context_note=s.context_note, usage=_total(s.usage),
    ).model_dump(exclude_none=True)
    return result(_text(a, s, structured.get("not_stored")), structured)


def _text(a: ListThreadsArgs, s: protocol.StatusResult, not_stored: str | None) -> str:
    health = "available" if s.available else f"unavailable: {s.reason or 'unknown reason'}"
    lines = [f"backend {s.backend}, model {s.model}, {health}"]
    found = f"{len(s.threads)} thread(s) matching {a.query!r}" if a.query else f"{len(s.threads)} thread(s)"
    where = f" (threads are stored in {s.store_location})" if s.store_location else ""
    lines.append(found + where + (":" if s.threads else "."))
    if not_stored:
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
    return "\n".join(lines)


def _iso(seconds: float | None) -> str | None:
    """Unix seconds as ISO 8601 in UTC, to the second; None for none (or one out of range)."""
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return None


def _total(u: protocol.UsageBody | None) -> UsageTotal | None:
    """A sum of calls' usage: the counts only (the timings are one call's)."""
    if u is None:
        return None
    return UsageTotal(input_tokens=u.input_tokens, output_tokens=u.output_tokens, reasoning_tokens=u.reasoning_tokens,
                      cached_tokens=u.cached_tokens)


def _usage_text(u: protocol.UsageBody | None) -> str:
    """A thread's total as the text shows it: only the counts reported."""
    if u is None:
        return ""
    counts = ((u.input_tokens, "in"), (u.cached_tokens, "cached"), (u.output_tokens, "out"),
              (u.reasoning_tokens, "reasoning"))
    parts = [f"{n} {what}" for n, what in counts if n is not None]
    return f", tokens {' / '.join(parts)}" if parts else ""


def _not_stored(s: protocol.StatusResult) -> str | None:
    """Why threads are not stored: the store the core could not use, or none configured."""
    if s.store_error:
        return s.store_error
    return None if s.store_location else NO_STATE_DIR


TOOL = McpTool("list_threads", declare, handle)
