"""`read_thread`: a thread's binding and its last turns, bounded in bytes."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.context import ServerRequestContext
from mcp.types import CallToolResult, Tool, ToolAnnotations
from pydantic import BaseModel, Field

from ...facts import MAX_OUTPUT_TOKENS
from ..models import Arguments, ErrorWording, ThreadId, parse_args, tool_schema
from ..tool import McpTool, ToolContext, output_value, result

# The bound on the turns' text it returns (the rest is left out, and counted).
READ_THREAD_BYTES = 32 * 1024


class ReadThreadArgs(Arguments):
    thread_id: Annotated[ThreadId, ErrorWording("a string", required="`thread_id` is required.")] = Field(
        description="The thread to read.")
    last: Annotated[int | None, ErrorWording(f"an integer from 1 to {MAX_OUTPUT_TOKENS}")] = Field(
        None, ge=1, le=MAX_OUTPUT_TOKENS, description="Only its last N turns (default: all that fit).",
    )


class TurnOutput(BaseModel):
    prompt: str
    reply: str | None = Field(None, description="Absent for a `schema` turn: see output.")
    output: Any = Field(None, description="A `schema` turn's value.")
    cut: bool | None = Field(None, description="True when its text was shortened to fit.")


class ReadThreadOutput(BaseModel):
    thread_id: str
    instructions: str | None = None
    tools: list[str]
    turns: int = Field(description="Turns the thread holds.")
    omitted: int = Field(description="Earlier turns left out of items.")
    dropped: int = Field(description="Turns condensed away before these (while this wisp held it).")
    items: list[TurnOutput] = Field(description="Its last turns, oldest first.")


def declare(tc: ToolContext) -> Tool:
    return Tool(
        name="read_thread",
        title="Reread a thread",
        description=(
            f"A thread's instructions, tools and last turns (at most {READ_THREAD_BYTES // 1024} KB of text; says "
            "what it left out)."
        ),
        input_schema=tool_schema(ReadThreadArgs),
        output_schema=tool_schema(ReadThreadOutput),
        annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                    open_world_hint=False),
    )


async def handle(tc: ToolContext, ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
    a: ReadThreadArgs = parse_args(ReadThreadArgs, args)
    r = await tc.core.read_thread(a.thread_id, a.last, READ_THREAD_BYTES)
    structured = ReadThreadOutput(
        thread_id=r.thread_id, instructions=r.instructions, tools=r.tools, turns=r.turns, omitted=r.omitted,
        dropped=r.condensed, items=[TurnOutput(prompt=t.prompt, reply=t.reply, cut=t.cut or None) for t in r.items],
    ).model_dump(exclude_none=True)
    for item, t in zip(structured["items"], r.items):
        if t.structured:
            # The value alone (it may be null), as respond gives it.
            del item["reply"]
            item["output"] = output_value(t.reply, r.thread_id)
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
    return result("\n".join(lines), structured)


TOOL = McpTool("read_thread", declare, handle)
