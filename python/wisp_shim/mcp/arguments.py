"""The MCP tools' arguments and results, one pydantic model each.

Each model is the one declaration of its tool's fields: it gives the inputSchema or
outputSchema that tools/list shows (`tool_schema`), checks a call's arguments
(`parse_args`, with errors that name the field and what it takes), and builds the
structured result.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import GenerateJsonSchema

from . import schema as output_schema
from ..errors import got, short
from ..facts import (  # noqa: F401
    MAX_OUTPUT_TOKENS,
    MAX_QUERY_BYTES,
    MODEL_TOOLS,
    REASONING_LEVELS,
    THREAD_ID_CHARS,
    THREAD_ID_RE,
    THREAD_ID_RULE,
)

# The thread-id rule, the model-tool catalogue and the largest token count are the core's
# (facts.py): tools/list is answered before the core is up.
# OpenAI-compatible servers take 0-2; Apple's model clamps to 0-1.
MAX_TEMPERATURE = 2
# list_threads' page size when the caller names none, and the most it may name.
DEFAULT_PAGE = 20
MAX_PAGE = 100


class ArgumentError(Exception):
    """A tool call's arguments are wrong; the message says which and how."""


@dataclass(frozen=True)
class ErrorWording:
    """How an argument's errors read: it must be `what`; `required` when it is missing;
    `items` when the list holds something else."""

    what: str
    required: str | None = None
    items: str | None = None


ThreadId = Annotated[str, Field(pattern=f"^{THREAD_ID_CHARS}$")]


class _Arguments(BaseModel):
    # strict: true is not a number and 5.0 not a token count, as JSON wording.
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class RespondArgs(_Arguments):
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
        Literal[REASONING_LEVELS] | None, ErrorWording("one of " + ", ".join(f'"{x}"' for x in REASONING_LEVELS))
    ] = Field(
        None,
        description=(
            "How hard a reasoning model thinks (OpenAI-compatible servers: reasoning_effort low/medium/high); omit "
            "for the model's default. A server refusing it is an error."
        ),
    )
    # Any here: schema.py checks it, with its own messages, after the other fields.
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


class UsageOutput(BaseModel):
    input_tokens: int | None = Field(
        None, description="Tokens read, all model requests (tool rounds too).")
    output_tokens: int | None = Field(None, description="Tokens written, reasoning included.")
    reasoning_tokens: int | None = Field(None, description="Of output_tokens, those spent reasoning.")
    cached_tokens: int | None = Field(None, description="Of input_tokens, those from the prompt cache.")
    first_token_ms: int | None = Field(None, description="Milliseconds to the first token (wisp's measure).")
    output_tokens_per_s: float | None = Field(
        None, description="Output tokens a second while writing (wisp's measure).")


# Counts summed over calls, each as respond's `usage` describes it: described there once, since
# every client reads tools/list whole on every session (and a docstring here would be the schema's).
class UsageTotal(BaseModel):
    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None


class CloseThreadArgs(_Arguments):
    thread_id: Annotated[ThreadId, ErrorWording("a string", required="`thread_id` is required.")] = Field(
        description="The thread to close.")


class ListThreadsArgs(_Arguments):
    # Its length and its words are the core's to judge (in bytes): a schema maxLength would count characters.
    query: Annotated[str | None, ErrorWording("a string")] = Field(
        None,
        description=f"Words to find in prompts and replies (at most {MAX_QUERY_BYTES} bytes of UTF-8); best first.",
    )
    limit: Annotated[int | None, ErrorWording(f"an integer from 1 to {MAX_PAGE}")] = Field(
        None, ge=1, le=MAX_PAGE, description=f"Threads per page (default {DEFAULT_PAGE}).",
    )
    cursor: Annotated[str | None, ErrorWording("a string")] = Field(None, description="next_cursor of the page before.")


class ReadThreadArgs(_Arguments):
    thread_id: Annotated[ThreadId, ErrorWording("a string", required="`thread_id` is required.")] = Field(
        description="The thread to read.")
    last: Annotated[int | None, ErrorWording(f"an integer from 1 to {MAX_OUTPUT_TOKENS}")] = Field(
        None, ge=1, le=MAX_OUTPUT_TOKENS, description="Only its last N turns (default: all that fit).",
    )


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
        None, description="With --state-dir: why this turn was not stored (kept in memory only).")
    usage: UsageOutput = Field(description="This call's cost as the backend reported it; a count not reported is "
                                           "absent, never guessed.")
    reasoning: str | None = Field(None, description="With `reasoning`: the level used.")
    finish_reason: Literal["length"] | None = Field(None, description="Cut short at the output cap.")


# The text block's line for a reply that stopped at the output cap (finish_reason "length").
CUT_AT_CAP_NOTE = ("[note: the reply stopped at the output cap and is cut short; ask for more with a larger "
                   "max_output_tokens (wisp's local model holds a reply to a quarter of --context-size)]")


class CloseThreadOutput(BaseModel):
    thread_id: str = Field(description="The thread named.")
    closed: bool = Field(description="True when a live thread was closed.")


class ThreadEntry(BaseModel):
    thread_id: str
    turns: int
    pending: int = Field(description="Calls running or waiting on it.")
    live: bool = Field(description="In memory now.")
    stored: bool = Field(description="In the state dir (--state-dir).")
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
        None, description="Why threads are not stored: no --state-dir, or why it is unusable.")
    context_note: str | None = Field(
        None, description="When the server was found to cut prompts: the window wisp now uses.")
    usage: UsageTotal | None = Field(None, description="Every call's usage since wisp started, summed.")
    threads: list[ThreadEntry]
    next_cursor: str | None = Field(None, description="The next page's cursor; absent on the last.")


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


class _CleanSchema(GenerateJsonSchema):
    """The schema as a client reads it: an optional field is its type (absent means unset,
    so no `anyOf` with null), and no generated titles or defaults."""

    def nullable_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: Any) -> Any:
        out = super().model_schema(schema)
        out.pop("title", None)
        return out

    def default_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def tool_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema a tool declares for this model, nested models written in place."""
    schema = model.model_json_schema(by_alias=True, schema_generator=_CleanSchema)
    defs = schema.pop("$defs", {})
    return _inline(schema, defs)


@functools.cache
def _fields(model: type[BaseModel]) -> list[tuple[str, ErrorWording]]:
    """Each argument's wire name and its error wording, in declaration order (once per model:
    it is on every call's path)."""
    out = []
    for name, info in model.model_fields.items():
        wording = next((m for m in info.metadata if isinstance(m, ErrorWording)), None)
        assert wording is not None, f"{model.__name__}.{name} has no ErrorWording"
        out.append((info.alias or name, wording))
    return out


def parse_args(model: type[_Arguments], args: dict[str, Any]) -> Any:
    """The call's arguments as `model`, or ArgumentError saying what is wrong.
    An argument given as null is taken as absent."""
    fields = _fields(model)
    allowed = [name for name, _ in fields]
    extra = sorted(set(args) - set(allowed))
    if extra:
        # Name a few, each shortened: a hostile call may carry thousands, or huge names.
        named = ", ".join(short(x) if len(x) > 60 else x for x in extra[:5])
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        takes = ", ".join(allowed) or "no arguments"
        raise ArgumentError(f"unknown argument(s) {named}{more}; this tool takes {takes}.")
    for name, wording in fields:
        if wording.required is not None and args.get(name) is None:
            raise ArgumentError(wording.required)
    given = {k: v for k, v in args.items() if v is not None}
    try:
        parsed = model.model_validate(given)
    except ValidationError as exc:
        raise ArgumentError(_message(exc, dict(fields), given)) from None
    if isinstance(parsed, RespondArgs) and parsed.output_schema is not None:
        try:
            parsed.output_schema = output_schema.check_schema(parsed.output_schema)
        except output_schema.SchemaError as err:
            raise ArgumentError(str(err)) from None
    return parsed


def _message(exc: ValidationError, wording: dict[str, ErrorWording], given: dict[str, Any]) -> str:
    error = exc.errors(include_url=False)[0]
    name = str(error["loc"][0])
    rule = wording[name]
    value = given.get(name)
    if len(error["loc"]) > 1 and rule.items is not None:
        return rule.items
    if error["type"] == "string_pattern_mismatch":
        return (f"`{name}` {short(value)} is not a valid thread id: use {THREAD_ID_RULE} (or omit it to start a new "
                "thread).")
    if error["type"].endswith("_type") or error["type"] in ("int_from_float", "float_parsing", "int_parsing"):
        return f"`{name}` must be {rule.what}, got {got(value)}."
    return f"`{name}` must be {rule.what}, got {short(value)}."
