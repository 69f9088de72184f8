"""`respond`: ask the local model, in a thread; the one tool that may run as an MCP task (mcp/tasks.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from mcp.server.context import ServerRequestContext
from mcp.types import CallToolResult, Tool, ToolAnnotations
from pydantic import BaseModel, Field

from ...core import protocol
from ...core.arrivals import Place
from ...facts import MAX_OUTPUT_TOKENS, MODEL_TOOLS, REASONING_LEVELS
from ...transport.guard import charge, json_size
from .. import schema as output_schema
from ..client_roots import client_roots
from ..models import ArgumentError, Arguments, ErrorWording, ThreadId, parse_args, tool_schema
from ..tool import McpTool, SendProgress, TaskSteps, ToolContext, output_value, progress_of, result

# The model-tool catalogue and the largest token count are the core's (facts.py): tools/list is
# answered before the core is up. OpenAI-compatible servers take 0-2; Apple's model clamps to 0-1.
MAX_TEMPERATURE = 2
# Progress messages are shown to people in a status line, not read by the model.
PROGRESS_MESSAGE_CHARS = 200
# The text block's line for a reply that stopped at the output cap (finish_reason "length").
CUT_AT_CAP_NOTE = ("[note: the reply stopped at the output cap and is cut short; ask for more with a larger "
                   "max_output_tokens (wisp's local model holds a reply to a quarter of --context-size)]")


class RespondArgs(Arguments):
    prompt: Annotated[
        str, ErrorWording("a string", required="`prompt` is required: the message for the model.")
    ] = Field(
        description="The message for the model: the task, with the context it needs.",
    )
    thread_id: Annotated[ThreadId | None, ErrorWording("a string")] = Field(
        None,
        description="Continue this thread; omit to start one with a generated id.",
    )
    fork_from: Annotated[ThreadId | None, ErrorWording("a string")] = Field(
        None,
        description=(
            "Copy this thread's history, instructions and tools into the new thread (thread_id new or omitted) and "
            "answer there; the source is unchanged."
        ),
    )
    rewind: Annotated[int | None, ErrorWording(f"an integer from 1 to {MAX_OUTPUT_TOKENS}")] = Field(
        None, ge=1, le=MAX_OUTPUT_TOKENS,
        description="Drop the thread's last N turns and answer in their place (none dropped if the call fails).",
    )
    instructions: Annotated[str | None, ErrorWording("a string")] = Field(
        None,
        description=(
            "System instructions (role, rules, output format) for a new thread."
        ),
    )
    tools: Annotated[
        list[str] | None, ErrorWording("a list of tool names", items="`tools` must be a list of tool names (strings).")
    ] = Field(
        None,
        description=(
            "Tools the model may call in a new thread. "
            + "; ".join(f"{name}: {what.rstrip('.')}" for name, what in MODEL_TOOLS.items())
            + ". Read-only, within wisp's roots (--root, the client's roots, else wisp's start directory)."
        ),
    )
    files: Annotated[
        list[Annotated[str, Field(min_length=1)]] | None,
        ErrorWording("a list of file paths", items="`files` must be a list of file paths (non-empty strings)."),
    ] = Field(
        None,
        description=(
            "Text files for the model with this prompt (any thread), read by wisp under its roots (relative: from "
            "the first root), never through you."
        ),
    )
    temperature: Annotated[float | None, ErrorWording(f"a number from 0 to {MAX_TEMPERATURE}")] = Field(
        None, ge=0, le=MAX_TEMPERATURE, description="Sampling temperature (default: the model's).",
    )
    max_output_tokens: Annotated[int | None, ErrorWording(f"an integer from 1 to {MAX_OUTPUT_TOKENS}")] = Field(
        None, ge=1, le=MAX_OUTPUT_TOKENS, description="Most tokens the reply may take.",
    )
    reasoning: Annotated[
        Literal[REASONING_LEVELS] | None,  # type: ignore[valid-type]  # the levels are the core's facts
        ErrorWording("one of " + ", ".join(f'"{x}"' for x in REASONING_LEVELS))
    ] = Field(
        None,
        description=(
            "How hard a reasoning model thinks (OpenAI-compatible servers: reasoning_effort low/medium/high); omit "
            "for the model's default. A server refusing it is an error."
        ),
    )
    # Any here: mcp/schema.py checks it, with its own messages, after the other fields.
    output_schema: Annotated[Any, ErrorWording("a JSON Schema object")] = Field(
        None,
        alias="schema",
        json_schema_extra={"type": "object"},
        description=(
            "JSON Schema the reply must match, returned parsed as `output`. Supported: " + output_schema.SUPPORTED
            + "; anything else is refused. A reply not matching (e.g. cut by max_output_tokens) is an invalid_output "
            "error, not kept."
        ),
    )

    def checked(self) -> RespondArgs:
        if self.output_schema is not None:
            try:
                self.output_schema = output_schema.check_schema(self.output_schema)
            except output_schema.SchemaError as err:
                raise ArgumentError(str(err)) from None
        return self


class UsageOutput(BaseModel):
    input_tokens: int | None = Field(
        None, description="Tokens read (tool rounds too).")
    output_tokens: int | None = Field(None, description="Tokens written, reasoning included.")
    reasoning_tokens: int | None = Field(None, description="Of output_tokens, those spent reasoning.")
    cached_tokens: int | None = Field(None, description="Of input_tokens, those from the prompt cache.")
    first_token_ms: int | None = Field(None, description="Time to the first token (ms).")
    output_tokens_per_s: float | None = Field(
        None, description="Output tokens a second while writing.")
    endpoint: str | None = Field(None, description="The model server that answered (host:port).")


class RespondOutput(BaseModel):
    thread_id: str = Field(description="Pass it back as thread_id to continue.")
    created: bool = Field(description="This call started the thread.")
    text: str | None = Field(None, description="The reply (absent with `schema`: see output).")
    condensed: bool = Field(description="Older turns were dropped to fit the context.")
    turns: int = Field(description="Turns the thread holds now.")
    dropped: int = Field(description="Turns condensing dropped in this call.")
    # May be JSON null, when the schema allows it: present whenever the call had a schema.
    output: Any = Field(None, description="With `schema`: the reply's JSON value.")
    store_error: str | None = Field(
        None, description="Why this turn was not stored (kept in memory only).")
    usage: UsageOutput = Field(description="This call's cost as the backend reported it; a count not reported is "
                                           "absent, never guessed.")
    reasoning: str | None = Field(None, description="With `reasoning`: the level used.")
    finish_reason: Literal["length"] | None = Field(None, description="Cut short at the output cap.")


def declare(tc: ToolContext) -> Tool:
    return Tool(
        name="respond",
        title="Ask the local model",
        description=(
            "Ask the local language model; returns its reply and a thread_id. Pass that back to continue the "
            "conversation (the model sees the earlier turns); an unknown id starts a new thread under it "
            "(created=true). instructions and tools bind at creation: passing them for an existing thread is an "
            "error, even empty. Calls on one thread run in order, threads in parallel. A thread outgrowing the "
            f"context loses its oldest turns (condensed=true). Retention: {tc.retention()}."
        ),
        input_schema=tool_schema(RespondArgs),
        output_schema=tool_schema(RespondOutput),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                    open_world_hint=False),
    )


@dataclass(frozen=True)
class _Call:
    """A respond call checked and ready to run: its arguments, the client's roots, and whether
    this wisp held a thread under the id it names."""

    args: RespondArgs
    roots: list[str] | None
    knew: bool
    place: Place


async def prepare(tc: ToolContext, ctx: ServerRequestContext[Any], args: dict[str, Any]) -> _Call:
    a: RespondArgs = parse_args(RespondArgs, args)
    # Its place on its thread before the roots are asked: a later call must not overtake it.
    place = tc.core.arrive(a.thread_id)
    try:
        roots = await client_roots(ctx) if a.tools or a.files else None
        if roots:
            charge(ctx.request, json_size(roots))  # held while the call runs, like its arguments
    except BaseException:
        place.leave()
        raise
    # Asked before the call, which makes the id known: a new caller-chosen id was never lost.
    return _Call(a, roots, a.thread_id is not None and tc.core.knew(a.thread_id), place)


async def run(
    tc: ToolContext, call: _Call, send_progress: SendProgress | None,
    stop: asyncio.Future[None] | None = None, on_sent: Callable[[], None] | None = None,
) -> CallToolResult:
    a, roots = call.args, call.roots
    on_progress = None
    if send_progress is not None:
        async def on_progress(count: int, status: str, text: str) -> None:
            await send_progress(float(count), _progress_message(status, text))

    checked: output_schema.CheckedSchema | None = a.output_schema
    try:
        r = await tc.core.respond(
            a.prompt, thread_id=a.thread_id, instructions=a.instructions, tools=a.tools, files=a.files or None,
            temperature=a.temperature, max_output_tokens=a.max_output_tokens,
            on_progress=on_progress, roots=roots, schema=checked.text if checked else None, reasoning=a.reasoning,
            fork_from=a.fork_from, rewind=a.rewind,
            stop=stop, on_sent=on_sent, place=call.place,
        )
    finally:
        call.place.leave()  # sent already, or failed before: either way the next call may go
    # With a schema the reply is its value: `output` alone carries it.
    out = RespondOutput(
        thread_id=r.thread_id, created=r.created, text=None if checked else r.text, condensed=r.condensed,
        turns=r.turns, dropped=r.dropped, store_error=r.store_error, usage=_usage(r.usage) or UsageOutput(),
        reasoning=a.reasoning, finish_reason=r.finish_reason,
    )
    structured = out.model_dump(exclude_none=True)
    if checked is not None:
        structured["output"] = output_value(r.text, r.thread_id)  # may be null
    return result(_content(r, call.knew), structured)


async def handle(tc: ToolContext, ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
    return await run(tc, await prepare(tc, ctx, args), progress_of(ctx))


def _usage(u: protocol.UsageBody | None) -> UsageOutput | None:
    if u is None:
        return None
    return UsageOutput(input_tokens=u.input_tokens, output_tokens=u.output_tokens, reasoning_tokens=u.reasoning_tokens,
                       cached_tokens=u.cached_tokens, first_token_ms=u.first_token_ms,
                       output_tokens_per_s=u.output_tokens_per_s, endpoint=u.endpoint)


def _content(r: protocol.RespondResult, restarted: bool) -> str:
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


TOOL = McpTool("respond", declare, handle, TaskSteps(prepare, run, lambda call: call.args.thread_id,
                                                       lambda call: call.place.leave()))
