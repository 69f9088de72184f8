"""The pipe protocol between the shim and wisp-core, version 2 (ARCHITECTURE.md).

One msgspec Struct per message, under the same names as the Swift side
(swift/WispCore/Pipe/Operations/, one file per operation, and Messages.swift); keep the two in step. Frames are a
4-byte unsigned big-endian length followed by that many bytes of UTF-8 JSON.

Every message is tagged, so each direction decodes in one pass: shim -> core messages
by `op` (one per operation, OPERATIONS); core -> shim messages by `event` (ready, progress,
stage, evicted, reply), and an ok reply's result by `op`, the op of the request it answers.
Version 2 added the core -> shim tags.
"""

from __future__ import annotations

import struct
import time
from typing import Union

import msgspec

from .. import errors
# The pipe's version and frame limit are the core's (facts.py). The core treats a frame over
# the limit as a protocol error and exits, so the shim must refuse to send one rather than let
# a single oversized prompt kill every thread.
from ..facts import MAX_FRAME_BYTES, PROTOCOL_VERSION  # noqa: F401 (the pipe's own names)

# The codes an error reply may carry (errors.py).
ERROR_CODES = errors.CORE_CODES

_HEADER = struct.Struct(">I")


# --- shim -> core -----------------------------------------------------------
# omit_defaults keeps absent optionals off the wire, as the core's field tables expect.


class PipeRequest(msgspec.Struct, tag_field="op", omit_defaults=True):
    """A shim -> core request, tagged by its `op`; `id` names it in the reply that answers it."""

    id: int


class RespondOptions(msgspec.Struct, omit_defaults=True):
    temperature: float | None = None
    max_output_tokens: int | None = None
    # The call's time limit as the caller set it (what a timeout error names).
    timeout_s: float | None = None
    # When that limit runs out, in monotonic_now() seconds: the core neither runs nor commits the
    # call after it, however late it reads the request.
    deadline: float | None = None
    # light | moderate | deep (facts.REASONING_LEVELS); None: the backend's default.
    reasoning: str | None = None


def monotonic_now() -> float:
    """The pipe's clock for RespondOptions.deadline: CLOCK_MONOTONIC, which the core reads too
    (Operations/Respond.swift's monotonicSeconds says why that one). Not time.monotonic(), which on macOS
    is another clock (mach_absolute_time, stopped while the machine sleeps)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class Respond(PipeRequest, tag="respond"):
    prompt: str
    thread_id: str | None = None
    instructions: str | None = None
    tools: list[str] | None = None
    options: RespondOptions | None = None
    progress: bool | None = None
    # The MCP client's roots: model tools of a thread this call creates may read them too.
    roots: list[str] | None = None
    # Text files the core reads under its roots (and `roots`) and gives the model with the prompt.
    files: list[str] | None = None
    # Structured output: the call's JSON Schema as compact JSON text (text keeps its key order
    # through Swift's decoder), already checked against wisp's supported subset (mcp/schema.py).
    schema: str | None = None
    # The call creates its thread as a copy of this one's binding and committed history.
    fork_from: str | None = None
    # The thread's last `rewind` turns are dropped as part of this call (all or nothing).
    rewind: int | None = None


class CloseThread(PipeRequest, tag="close_thread"):
    thread_id: str


class Cancel(PipeRequest, tag="cancel"):
    request: int


class Status(PipeRequest, tag="status"):
    """The backend's state and a page of threads: with `query`, those holding its words, best
    match first; else most recently used first. `cursor`: a StatusResult's `next_cursor`."""

    query: str | None = None
    limit: int | None = None
    cursor: str | None = None


class ReadThread(PipeRequest, tag="read_thread"):
    """A thread's binding and its last turns (at most `last`), at most `max_bytes` of their text."""

    thread_id: str
    last: int | None = None
    max_bytes: int | None = None


class Ping(PipeRequest, tag="ping"):
    """Liveness: the core's dispatcher answers at once (PingResult), touching no backend."""



# --- core -> shim -----------------------------------------------------------
# Every message is tagged by `event`, and an ok reply's result by `op` (the request it
# answers), so that one Decoder(CoreMessage) reads any of them, result included, in one pass.


class Ready(msgspec.Struct, tag_field="event", tag="ready"):
    id: int
    protocol: int
    backend: str
    model: str
    pid: int
    # wisp's version, built into the core (version.py refuses another); "" from a core too old to say.
    version: str = ""
    # Threads are stored (--state-dir): a crash of this core loses none of their committed turns.
    durable: bool = False


class Progress(msgspec.Struct, tag_field="event", tag="progress"):
    """A partial reply of call `id`: `text` the tail of the answer so far (a bounded preview, the
    core's facts say how long), `chars` the answer's length so far in code points."""

    id: int
    text: str
    tokens: int
    chars: int = 0


class Stage(msgspec.Struct, tag_field="event", tag="stage"):
    """What call `id` waits for before its first token: `queue` (`count`: calls of its thread
    ahead of it, the running one included), `slot` (every model slot busy with other threads) or
    `prompt` (the model reads it; `count`: about how many tokens, when known)."""

    id: int
    stage: str
    count: int | None = None


class Evicted(msgspec.Struct, tag_field="event", tag="evicted"):
    """The core evicted `thread_id` (least recently used) to make room; sent before the reply
    of the call that caused it."""

    id: int
    thread_id: str


class ErrorBody(msgspec.Struct):
    code: str
    message: str


class UsageBody(msgspec.Struct, omit_defaults=True):
    """Tokens the model requests cost, as the backend reported them: an unreported count is absent."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    # Of input_tokens, those the server took from its prompt cache.
    cached_tokens: int | None = None
    # One call's own (absent from totals): wisp's measure of its wait for the first token, and
    # of the output tokens a second while generating.
    first_token_ms: int | None = None
    output_tokens_per_s: float | None = None
    # With several model servers: the one that answered the call (host:port).
    endpoint: str | None = None


class PipeResult(msgspec.Struct, tag_field="op"):
    """An ok reply's result, tagged by the `op` of the request it answers."""


class RespondResult(PipeResult, tag="respond", omit_defaults=True):
    thread_id: str
    created: bool
    text: str
    condensed: bool
    turns: int
    dropped: int
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    # Durable threads only: why this turn could not be stored (kept in memory only).
    store_error: str | None = None
    # What this call's model requests cost, added up (tool rounds included).
    usage: UsageBody | None = None
    # "length" when the model server stopped the reply at its output cap; None otherwise.
    finish_reason: str | None = None


class CloseThreadResult(PipeResult, tag="close_thread"):
    thread_id: str
    closed: bool


class CancelResult(PipeResult, tag="cancel"):
    cancelled: bool


class PingResult(PipeResult, tag="ping"):
    pass


class ThreadInfo(msgspec.Struct):
    thread_id: str
    turns: int
    pending: int
    live: bool = True
    stored: bool = False
    # Live threads: what their committed calls cost so far (since created or resumed).
    usage: UsageBody | None = None
    # Unix seconds of its first and latest committed turn, where known.
    created_at: float | None = None
    updated_at: float | None = None
    # The start of its first prompt and of its last reply, and its instructions, each clipped by the core.
    first_prompt: str | None = None
    last_reply: str | None = None
    instructions: str | None = None


class EndpointInfo(msgspec.Struct):
    """One model server of several (host:port only)."""

    endpoint: str
    up: bool
    pinned: int
    reason: str | None = None
    model: str | None = None
    context_size: int | None = None
    slots: int | None = None


class StatusResult(PipeResult, tag="status"):
    backend: str
    model: str
    available: bool
    context_size: int
    max_threads: int
    max_queue: int
    threads: list[ThreadInfo]
    reason: str | None = None
    tools: list[str] = []
    # Where threads are stored (a state dir), when durable; why the store asked for is not in use.
    store_location: str | None = None
    store_error: str | None = None
    # The store's engine and versions, or why they are not known ("memory" without a store).
    store_about: str | None = None
    # For the next page, when there is one.
    next_cursor: str | None = None
    # What the core's committed calls cost since it started.
    usage: UsageBody | None = None
    # The server was found to cut prompts silently: the window wisp learnt, and how.
    context_note: str | None = None
    # With several model servers: each one, as --check lists it.
    endpoints: list[EndpointInfo] | None = None


class TurnItem(msgspec.Struct):
    prompt: str
    reply: str
    # The turn answered a `schema` and `reply` is its value's JSON text, whole.
    structured: bool = False
    # Its prompt or reply was clipped to fit the reading.
    cut: bool = False


class ReadThreadResult(PipeResult, tag="read_thread"):
    thread_id: str
    tools: list[str]
    # Turns the thread holds; `items` are its last ones, `omitted` the earlier ones left out.
    turns: int
    omitted: int
    # Turns condensing dropped from the thread while this core held it.
    condensed: int
    items: list[TurnItem]
    instructions: str | None = None


# --- the operations -----------------------------------------------------------
# Every operation of the pipe as its request and the result of its ok reply (both tagged by its
# op): the one list the request and result unions, the op names and the error's names come from.
# The core states its own list (its facts' "operations"); tests/python/test_agreement.py holds
# the two to each other.
OPERATIONS: tuple[tuple[type[PipeRequest], type[PipeResult]], ...] = (
    (Respond, RespondResult),
    (CloseThread, CloseThreadResult),
    (Cancel, CancelResult),
    (Status, StatusResult),
    (ReadThread, ReadThreadResult),
    (Ping, PingResult),
)


def op_name(message: type[PipeRequest] | type[PipeResult]) -> str:
    tag = message.__struct_config__.tag
    assert isinstance(tag, str), message
    return tag


assert all(op_name(request) == op_name(result) for request, result in OPERATIONS), "a result tagged by another op"
OP_NAMES = tuple(op_name(request) for request, _ in OPERATIONS)
# For msgspec's one-pass decoding (and a request's encoding): the unions of the list above.
Request = Union[tuple(request for request, _ in OPERATIONS)]  # type: ignore[valid-type]
Result = Union[tuple(result for _, result in OPERATIONS)]  # type: ignore[valid-type]


class Reply(msgspec.Struct, tag_field="event", tag="reply"):
    """Exactly one per request: `ok` with the op's result, or not ok with an error."""

    id: int
    ok: bool
    result: Result | None = None  # type: ignore[valid-type]  # the union is built from OPERATIONS
    error: ErrorBody | None = None

    def __post_init__(self) -> None:
        # Raised inside the decoder, so a reply that breaks this fails like any malformed frame.
        if self.ok and self.result is None:
            raise ValueError(f"reply {self.id} is ok but carries no result")
        if not self.ok and self.error is None:
            raise ValueError(f"reply {self.id} failed but carries no error")


CoreMessage = Ready | Progress | Stage | Evicted | Reply


class ProtocolError(Exception):
    """The byte stream from the core cannot be trusted any more."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(CoreMessage)


def encode_payload(message: PipeRequest) -> bytes:
    return _encoder.encode(message)


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(payload)} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    return _HEADER.pack(len(payload)) + payload


def encode(message: PipeRequest) -> bytes:
    """One whole frame for a shim -> core message."""
    return frame(encode_payload(message))


def decode_message(payload: bytes | memoryview) -> CoreMessage:
    """Decode one core -> shim payload, an ok reply's result included; raises ProtocolError
    when it is not one."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"undecodable {_meant(payload)} from the core: {exc}") from None


_RESULT_NAMES = {op_name(result): result.__name__ for _, result in OPERATIONS}


def _meant(payload: bytes | memoryview) -> str:
    """What a payload that did not decode says it is, for the error (only on that path)."""
    try:
        value = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return "message"
    if not isinstance(value, dict):
        return "message"
    result = value.get("result")
    if value.get("event") == "reply" and isinstance(result, dict) and result.get("op") in _RESULT_NAMES:
        return f"reply (a {_RESULT_NAMES[result['op']]})"
    event = value.get("event")
    return f"{event} message" if isinstance(event, str) and len(event) < 40 else "message"


class FrameDecoder:
    """Incremental: feed bytes as they arrive, in any split, and take whole payloads."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._start = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        buf = self._buf
        start = self._start
        end = len(buf)
        while end - start >= 4:
            (n,) = _HEADER.unpack_from(buf, start)
            if n > self.max_bytes:
                raise ProtocolError(f"frame of {n} bytes is over the {self.max_bytes}-byte limit")
            if end - start - 4 < n:
                break
            out.append(bytes(buf[start + 4 : start + 4 + n]))
            start += 4 + n
        # Compact only once consumed bytes dominate, so a burst of small frames
        # does not turn into quadratic copying.
        if start and start * 2 >= end:
            del buf[:start]
            start = 0
        self._start = start
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._start

    def finish(self) -> None:
        """At end of stream: an unfinished frame means the peer died mid-write."""
        if self.buffered:
            raise ProtocolError(f"stream ended inside a frame ({self.buffered} bytes left over)")
