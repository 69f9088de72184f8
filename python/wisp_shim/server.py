"""The MCP surface: tools, their schemas and descriptions, argument checks, and the
mapping of every failure to a tool error that carries the real reason.

Built on the SDK's low-level Server: its high-level MCPServer masks plain exceptions as
"Error executing tool …", and the caller must see why a call failed.
"""

from __future__ import annotations

import logging
import re
import warnings
from urllib.parse import unquote, urlsplit
from typing import Any

import anyio
from mcp import MCPError
from mcp.server import Server, ServerRequestContext
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

from . import __version__
from . import protocol as p
from . import schema as output_schema
from . import errors
from .client import Core
from .errors import ShimError

log = logging.getLogger("wisp.server")

THREAD_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# The core's model-tool catalogue (swift/WispCore/Tools/Catalogue.swift), named here because
# tools/list is answered before the core is up; a test checks the two agree.
MODEL_TOOLS = {
    "read_file": "read a text file, optionally a line range",
    "list_directory": "list a directory",
    "search_text": "find lines matching a literal or regex pattern, as file:line: text",
}
# How long a call waits for the client to list its roots before going on without them.
ROOTS_TIMEOUT_S = 2.0
# Above any model's reply length, and inside the core's 64-bit integers.
MAX_OUTPUT_TOKENS = 2**31 - 1
# OpenAI-compatible servers take 0-2; Apple's model clamps to 0-1.
MAX_TEMPERATURE = 2
# More roots than any real workspace offers; past this a call that binds tools is refused
# (rather than some roots dropped without the caller knowing which).
MAX_CLIENT_ROOTS = 256
# Progress messages are shown to people in a status line, not read by the model.
PROGRESS_MESSAGE_CHARS = 200


def _instructions(max_threads: int) -> str:
    return (
        "wisp hands work to a local language model and keeps conversation threads with it. "
        "Call `respond` with a prompt; it returns a thread_id. Pass that thread_id back to continue "
        "the same conversation without resending earlier context. Threads live in memory only: at most "
        f"{max_threads} at once (the least recently used is dropped), and all are lost when wisp restarts. "
        "A result with created=true for a thread_id you passed means that thread was gone and a new one "
        "started. Close threads you are done with using `close_thread`."
    )


def _respond_tool(max_threads: int) -> Tool:
    return Tool(
        name="respond",
        title="Ask the local model",
        description=(
            "Send a prompt to the local language model and get its reply. Omit thread_id to start a new "
            "thread; pass the thread_id from an earlier result to continue that conversation (the model "
            "sees the earlier turns). An unknown thread_id starts a new thread under that id "
            "(created=true says so). instructions and tools are fixed when a thread is created; passing "
            "them for an existing thread is an error, even empty: omit them to continue. Calls on one thread run in order; different threads "
            "run in parallel. If a thread outgrows the model's context, its oldest turns are dropped "
            "(condensed=true). Retention: threads are kept in memory only, at most "
            f"{max_threads} (least recently used evicted first), and lost when wisp restarts."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "The message for the model: the task, with whatever context it needs."},
                "thread_id": {
                    "type": "string",
                    "pattern": "^[A-Za-z0-9._-]{1,64}$",
                    "description": "Continue this thread. Omit to start a new one with a generated id. 1-64 characters of A-Z a-z 0-9 . _ -.",
                },
                "instructions": {
                    "type": "string",
                    "description": "System instructions for a NEW thread (role, rules, output format). Only allowed when the call creates the thread.",
                },
                "tools": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": (
                        "Tools the model may call in a NEW thread (only allowed when the call creates it): "
                        + "; ".join(f"{name}: {what}" for name, what in MODEL_TOOLS.items())
                        + ". Read-only, confined to wisp's roots (--root, the client's roots, else the directory wisp started in)."
                    ),
                },
                "files": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": (
                        "Paths of text files for the model to read with this prompt, read by wisp itself under its roots "
                        "(--root, the client's roots); relative paths are taken from the first root. Their text never "
                        "passes through you. Works on new and existing threads; the files join this turn."
                    ),
                },
                "temperature": {"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE, "description": "Sampling temperature for this call; omit for the model's default."},
                "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT_TOKENS, "description": "Upper bound on the reply's length in tokens for this call."},
                "schema": {
                    "type": "object",
                    "description": (
                        "A JSON Schema for this call's reply: the model can only produce JSON matching it, returned "
                        "parsed as `output` (and as JSON text in `text`). Supported: " + output_schema.SUPPORTED + ". "
                        "Anything else is refused. A reply that does not match (e.g. cut off by max_output_tokens) is an "
                        "invalid_output error and is not added to the thread."
                    ),
                },
            },
            "required": ["prompt"],
            "additionalProperties": False,
        },
        output_schema={
            "type": "object",
            "properties": {
                "thread_id": {"type": "string", "description": "Pass this back as thread_id to continue the conversation."},
                "created": {"type": "boolean", "description": "True when this call started a new thread."},
                "text": {"type": "string", "description": "The model's reply."},
                "condensed": {"type": "boolean", "description": "True when older turns were dropped to fit the model's context."},
                "turns": {"type": "integer", "description": "Turns the thread holds after this call."},
                "dropped": {"type": "integer", "description": "Turns dropped by condensing during this call."},
                "prompt_tokens": {"type": "integer"},
                "output_tokens": {"type": "integer"},
                "output": {"description": "With `schema`: the reply as a JSON value that matches it."},
                "store_error": {"type": "string", "description": "With --state-dir: why this turn could not be stored (the thread is in memory only)."},
            },
            "required": ["thread_id", "created", "text", "condensed", "turns", "dropped"],
        },
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False),
    )


CLOSE_THREAD = Tool(
    name="close_thread",
    title="Close a thread",
    description=(
        "Forget a thread and free its memory. Closing an unknown or already closed thread is not an error "
        "(closed=false). A call already running on the thread still finishes."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "thread_id": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$", "description": "The thread to close."},
        },
        "required": ["thread_id"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "thread_id": {"type": "string"},
            "closed": {"type": "boolean", "description": "True when a live thread was closed."},
        },
        "required": ["thread_id", "closed"],
    },
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False),
)

LIST_THREADS = Tool(
    name="list_threads",
    title="List live threads",
    description="List wisp's threads: live ones (most recently used first), then stored ones not in memory (with --state-dir), with their turn counts, plus the backend and model in use. Use it to recover thread ids.",
    input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    output_schema={
        "type": "object",
        "properties": {
            "backend": {"type": "string"},
            "model": {"type": "string"},
            "available": {"type": "boolean"},
            "reason": {"type": "string"},
            "context_size": {"type": "integer"},
            "max_threads": {"type": "integer"},
            "state_dir": {"type": "string", "description": "Where threads are stored (--state-dir), when they are."},
            "threads": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "thread_id": {"type": "string"},
                        "turns": {"type": "integer"},
                        "pending": {"type": "integer"},
                        "live": {"type": "boolean", "description": "In memory now."},
                        "stored": {"type": "boolean", "description": "In the state dir (--state-dir); a stored thread that is not live resumes on its next respond."},
                    },
                    "required": ["thread_id", "turns", "pending", "live", "stored"],
                },
            },
        },
        "required": ["backend", "model", "available", "context_size", "max_threads", "threads"],
    },
    annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False),
)


class ArgumentError(Exception):
    pass


def _error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def _opt(args: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = args.get(name)
    if value is None:
        return None
    # bool is an int in Python, but true is not a token count.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ArgumentError(f"`{name}` must be {what}, got {type(value).__name__} {_short(value)}.")
    return value


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        # repr of a huge int is slow, and past 4,300 digits refused by Python itself.
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _thread_id(args: dict[str, Any], required: bool) -> str | None:
    tid = _opt(args, "thread_id", str, "a string")
    if tid is None:
        if required:
            raise ArgumentError("`thread_id` is required.")
        return None
    if not THREAD_ID_RE.fullmatch(tid):
        raise ArgumentError(
            f"`thread_id` {_short(tid)} is not a valid thread id: use 1-64 characters of A-Z a-z 0-9 . _ - "
            "(or omit it to start a new thread)."
        )
    return tid


def _check_unknown(args: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(args) - set(allowed))
    if extra:
        # Name a few, each shortened: a hostile call may carry thousands, or huge names.
        named = ", ".join(_short(x) if len(x) > 60 else x for x in extra[:5])
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        raise ArgumentError(f"unknown argument(s) {named}{more}; this tool takes {', '.join(allowed) or 'no arguments'}.")


_RESPOND_ARGS = ("prompt", "thread_id", "instructions", "tools", "files", "temperature", "max_output_tokens", "schema")


def _respond_args(args: dict[str, Any]) -> dict[str, Any]:
    _check_unknown(args, _RESPOND_ARGS)
    prompt = args.get("prompt")
    if prompt is None:
        raise ArgumentError("`prompt` is required: the message for the model.")
    if not isinstance(prompt, str):
        raise ArgumentError(f"`prompt` must be a string, got {type(prompt).__name__} {_short(prompt)}.")
    tools = _opt(args, "tools", list, "a list of tool names")
    if tools is not None and not all(isinstance(t, str) for t in tools):
        raise ArgumentError("`tools` must be a list of tool names (strings).")
    files = _opt(args, "files", list, "a list of file paths")
    if files is not None and not all(isinstance(f, str) and f for f in files):
        raise ArgumentError("`files` must be a list of file paths (non-empty strings).")
    temperature = _opt(args, "temperature", (int, float), f"a number from 0 to {MAX_TEMPERATURE}")  # type: ignore[arg-type]
    # Compared before any float(): a JSON integer of 400 digits is a valid Python int, and
    # converting it would overflow. NaN fails both comparisons.
    if temperature is not None and not 0 <= temperature <= MAX_TEMPERATURE:
        raise ArgumentError(f"`temperature` must be a number from 0 to {MAX_TEMPERATURE}, got {_short(temperature)}.")
    max_tokens = _opt(args, "max_output_tokens", int, f"an integer from 1 to {MAX_OUTPUT_TOKENS}")
    if isinstance(max_tokens, int) and not 1 <= max_tokens <= MAX_OUTPUT_TOKENS:
        raise ArgumentError(f"`max_output_tokens` must be an integer from 1 to {MAX_OUTPUT_TOKENS}, got {_short(max_tokens)}.")
    return {
        "prompt": prompt,
        "thread_id": _thread_id(args, required=False),
        "instructions": _opt(args, "instructions", str, "a string"),
        "tools": tools,
        "files": files or None,
        "temperature": float(temperature) if temperature is not None else None,
        "max_output_tokens": max_tokens,
        "schema": _schema(args),
    }


def _schema(args: dict[str, Any]) -> output_schema.Checked | None:
    if args.get("schema") is None:
        return None
    try:
        return output_schema.check_schema(args["schema"])
    except output_schema.SchemaError as exc:
        raise ArgumentError(str(exc)) from None


def _output(checked: output_schema.Checked, r: p.RespondResult) -> Any:
    """The reply's value. The core has already checked it before committing the turn; this
    second check (jsonschema) only fails if the two disagree, and then says the turn is kept."""
    try:
        return output_schema.validate_output(checked, r.text)
    except ValueError as exc:
        log.error("the core accepted a reply that jsonschema rejects (%s): %r", exc, r.text[:200])
        raise ShimError(
            errors.INVALID_OUTPUT,
            f"the model's reply does not match the schema: {exc}. wisp's core accepted it, so this turn is in "
            f"thread {r.thread_id}'s history. Try a simpler schema, or close the thread and start again.",
        ) from None


def _respond_content(r: p.RespondResult, asked_for: str | None) -> str:
    lines = [r.text, ""]
    if r.created and asked_for is not None:
        lines.append("[note: no live thread had this id (evicted, closed or lost), so this started a new one]")
    if r.condensed:
        lines.append(f"[note: {r.dropped} older turn(s) were dropped to fit the model's context]")
    if r.store_error:
        lines.append(f"[warning: this turn was answered but not stored, so a crash or restart would lose the thread: {r.store_error}]")
    lines.append(f"[thread_id: {r.thread_id}]")
    return "\n".join(lines)


async def _client_roots(ctx: ServerRequestContext[Any]) -> list[str] | None:
    """The client's file:// roots, for a call that binds tools or attaches files; None when it offers none.

    Roots are deprecated in the 2026-07-28 protocol but still what Claude Code, Cursor and
    VS Code send; a client without them (or without a back-channel) simply gets wisp's own.
    """
    caps = ctx.session.client_capabilities
    if caps is None or caps.roots is None:
        return None
    # The raw request where the SDK offers it: its typed list_roots validates the result twice
    # against pydantic URL types before anyone can count the roots (about 45 us a root: 0.9 s
    # for 20,000), and it rewrites `file:relative` to `file:///relative`, which would hide a
    # root that is not absolute. Only the uri strings are used, checked by _root_paths.
    connection = getattr(ctx.session, "_connection", None)
    try:
        with anyio.fail_after(ROOTS_TIMEOUT_S), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if callable(getattr(connection, "send_raw_request", None)):
                raw = await connection.send_raw_request("roots/list", None)
            else:
                raw = (await ctx.session.list_roots()).model_dump(mode="json")
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:  # no back-channel, a slow client, or a client error: go on without
        log.debug("client roots unavailable: %s", exc)
        return None
    listed = raw.get("roots") if isinstance(raw, dict) else None
    if not isinstance(listed, list):
        log.debug("client roots unusable: %s", _short(raw))
        return None
    uris = [r.get("uri") if isinstance(r, dict) else r for r in listed[: MAX_CLIENT_ROOTS + 1]]
    return _root_paths(uris, offered=len(listed)) or None


def _root_paths(uris: list[Any], offered: int | None = None) -> list[str]:
    """The local directories named by the client's file:// roots, each once, in order.

    A root that does not decode to one absolute local path (a NUL inside, which the core's
    file calls would cut the path at; a relative path; another host; bytes that are not
    UTF-8) is refused rather than guessed at: the caller must not get a directory the client
    never offered. Linear in the number of roots."""
    offered = len(uris) if offered is None else offered
    if offered > MAX_CLIENT_ROOTS:
        raise ShimError(
            errors.INVALID_ARGUMENT,
            f"the MCP client offered {offered} roots, more than wisp's limit of {MAX_CLIENT_ROOTS}; offer fewer "
            "roots to wisp, or start it with --root for the directories the model needs.",
        )
    paths: dict[str, None] = {}
    for uri in uris:
        if not isinstance(uri, str):
            raise ShimError(errors.INVALID_ARGUMENT, f"the MCP client offered a root whose uri is not a string ({_short(uri)}); fix that root in the client.")
        url = urlsplit(uri)
        if url.scheme != "file":
            continue  # not a directory on this machine: nothing for the file tools
        try:
            path = unquote(url.path, errors="strict")
        except UnicodeDecodeError:
            path = ""
        if url.netloc not in ("", "localhost") or not path.startswith("/") or "\x00" in path:
            raise ShimError(
                errors.INVALID_ARGUMENT,
                f"the MCP client offered the root {_short(uri)}, which does not decode to an absolute local path "
                "(file:///absolute/path, with no NUL and UTF-8 percent-escapes); fix that root in the client, or start "
                "wisp with --root instead.",
            )
        paths[path] = None
    return list(paths)


def _progress_message(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= PROGRESS_MESSAGE_CHARS:
        return text
    # The tail is what changed since the last notification.
    return "…" + text[-(PROGRESS_MESSAGE_CHARS - 1):]


def build_server(core: Core, max_threads: int = 32) -> Server[Any]:
    respond_tool = _respond_tool(max_threads)
    tools = [respond_tool, CLOSE_THREAD, LIST_THREADS]
    listing = ListToolsResult(tools=tools)

    async def list_tools(ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None) -> ListToolsResult:
        return listing

    async def respond(ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
        a = _respond_args(args)
        token = ctx.meta.get("progress_token") if ctx.meta else None
        on_progress = None
        if token is not None:
            async def on_progress(tokens: int, text: str) -> None:
                await ctx.session.report_progress(float(tokens), None, _progress_message(text))

        roots = await _client_roots(ctx) if a["tools"] or a["files"] else None
        checked = a.pop("schema")
        r = await core.respond(on_progress=on_progress, roots=roots, schema=checked.text if checked else None, **a)
        structured = {
            "thread_id": r.thread_id,
            "created": r.created,
            "text": r.text,
            "condensed": r.condensed,
            "turns": r.turns,
            "dropped": r.dropped,
        }
        if r.prompt_tokens is not None:
            structured["prompt_tokens"] = r.prompt_tokens
        if r.output_tokens is not None:
            structured["output_tokens"] = r.output_tokens
        if checked is not None:
            structured["output"] = _output(checked, r)
        if r.store_error is not None:
            structured["store_error"] = r.store_error
        return CallToolResult(
            content=[TextContent(type="text", text=_respond_content(r, a["thread_id"]))],
            structured_content=structured,
        )

    async def close_thread(ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
        _check_unknown(args, ("thread_id",))
        tid = _thread_id(args, required=True)
        assert tid is not None
        r = await core.close_thread(tid)
        text = f"Closed thread {r.thread_id}." if r.closed else f"No live thread {r.thread_id} (nothing to close)."
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content={"thread_id": r.thread_id, "closed": r.closed},
        )

    async def list_threads(ctx: ServerRequestContext[Any], args: dict[str, Any]) -> CallToolResult:
        _check_unknown(args, ())
        s = await core.status()
        structured: dict[str, Any] = {
            "backend": s.backend,
            "model": s.model,
            "available": s.available,
            "context_size": s.context_size,
            "max_threads": s.max_threads,
            "threads": [
                {"thread_id": t.thread_id, "turns": t.turns, "pending": t.pending, "live": t.live, "stored": t.stored} for t in s.threads
            ],
        }
        if s.state_dir:
            structured["state_dir"] = s.state_dir
        if s.reason:
            structured["reason"] = s.reason
        lines = [f"backend {s.backend}, model {s.model}, " + ("available" if s.available else f"unavailable: {s.reason or 'unknown reason'}")]
        live = sum(t.live for t in s.threads)
        lines.append(f"{live} of {s.max_threads} threads live" + (f", {len(s.threads) - live} more stored in {s.state_dir}" if s.state_dir else "") + (":" if s.threads else "."))
        if s.state_error:
            lines.append(f"threads are not stored: {s.state_error}")
        lines += [
            f"- {t.thread_id}: {t.turns} turn(s){f', {t.pending} call(s) pending' if t.pending else ''}{'' if t.live else ' (stored)'}"
            for t in s.threads
        ]
        return CallToolResult(content=[TextContent(type="text", text="\n".join(lines))], structured_content=structured)

    handlers = {"respond": respond, "close_thread": close_thread, "list_threads": list_threads}

    async def call_tool(ctx: ServerRequestContext[Any], params: CallToolRequestParams) -> CallToolResult:
        handler = handlers.get(params.name)
        if handler is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {_short(params.name)} (wisp has {', '.join(handlers)})")
        args = params.arguments or {}
        try:
            return await handler(ctx, args)
        except ArgumentError as exc:
            return _error(f"{errors.INVALID_ARGUMENT}: {exc}")
        except ShimError as exc:
            return _error(str(exc))
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            # Anything else is a bug in wisp; the caller still gets a tool error, not a silent failure.
            log.exception("tool %s failed", params.name)
            return _error(f"{errors.INTERNAL}: wisp failed unexpectedly ({type(exc).__name__}: {exc}); see its log on stderr.")

    return Server(
        "wisp",
        version=__version__,
        title="wisp: threads with a local model",
        instructions=_instructions(max_threads),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
