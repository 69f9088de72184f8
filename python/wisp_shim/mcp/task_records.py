"""What a task is, apart from running it (mcp/tasks.py): the two generations' words and wisp's
bounds, a task's record and its fields on the wire, the job a call hands over, and whose a task is."""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .. import config

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"

DEFAULT_TASK_TTL_S = 3600.0
DEFAULT_MAX_TASKS = 32
# Over every client of one wisp (sessions of a shared server included).
MAX_TASKS_TOTAL = 256
# A ttl asked for below this is raised to it: a result freed before anyone could poll is no result.
MIN_TTL_MS = 1000
POLL_INTERVAL_MS = 1000
TASKS_PER_PAGE = 50
# wisp's JSON-RPC errors for tasks, in the range both generations leave to implementations.
TOO_MANY_TASKS = -32000
TASK_CANCELLED = -32001
HEADER_MISMATCH = -32020

LEGACY_CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
TASK_SUPPORT = {"taskSupport": "optional"}

WORKING, COMPLETED, FAILED, CANCELLED = "working", "completed", "failed", "cancelled"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})


@dataclass(frozen=True)
class TaskLimits:
    ttl_s: float = DEFAULT_TASK_TTL_S
    per_client: int = DEFAULT_MAX_TASKS

    @classmethod
    def from_env(cls) -> TaskLimits:
        """WISP_TASK_TTL (seconds) and WISP_MAX_TASKS; a bad value is refused at start."""
        ttl_text, max_text = config.env("WISP_TASK_TTL"), config.env("WISP_MAX_TASKS")
        try:
            ttl = float(ttl_text) if ttl_text else DEFAULT_TASK_TTL_S
        except ValueError:
            ttl = -1.0
        if not (math.isfinite(ttl) and MIN_TTL_MS / 1000 <= ttl <= 7 * 24 * 3600):
            raise ValueError(
                f"WISP_TASK_TTL must be a number of seconds from {MIN_TTL_MS / 1000:g} to 604800, got {ttl_text!r}"
            )
        try:
            most = int(max_text) if max_text else DEFAULT_MAX_TASKS
        except ValueError:
            most = 0
        if not 1 <= most <= MAX_TASKS_TOTAL:
            raise ValueError(f"WISP_MAX_TASKS must be a whole number from 1 to {MAX_TASKS_TOTAL}, got {max_text!r}")
        return cls(ttl, most)


P = TypeVar("P")


@dataclass
class Job(Generic[P]):
    """What mcp/server.py hands over for one `respond` call: `prepare` checks it (a tool error comes
    back as a CallToolResult, else the prepared call), `run` runs a prepared call with a progress
    sender (value, message), a stop signal and a callback for when it is queued, and
    `thread_id` names the thread a prepared call continues (None: a new one), and `abandon` lets
    go of a prepared call that will not run (its place among its thread's arrivals)."""

    prepare: Callable[[], Awaitable[P | CallToolResult]]
    run: Callable[[P, Callable[[float, str], Awaitable[None]] | None, asyncio.Future[None] | None,
                   Callable[[], None] | None], Awaitable[CallToolResult]]
    thread_id: Callable[[P], str | None]
    abandon: Callable[[P], None]
    plain_progress: Callable[[float, str], Awaitable[None]] | None


@dataclass(eq=False)
class Task:
    id: str
    owner: tuple[Any, ...]
    generation: str
    ttl_ms: int
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    status: str = WORKING
    message: str | None = None
    # The call's result as the plain call's wire form, or the JSON-RPC error it ended with.
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    stop: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # Set once the task has ended and its client was told (notifications/tasks/status).
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once its handle is on its way: nothing is said of a task before its client knows its id.
    announced: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None
    expiry: asyncio.TimerHandle | None = None
    # Whether it takes a place under WISP_MAX_TASKS: running, or a result no one has collected yet.
    counted: bool = True

    def touch(self, status: str | None = None, message: str | None = None) -> None:
        if status is not None:
            self.status = status
        if message is not None:
            self.message = message
        self.updated = time.time()

    def end(self, status: str, message: str | None = None) -> None:
        """Its one status change: from `working` to how it ended (`done` follows once told)."""
        self.touch(status, message)


class UpdateParams(RequestParams):
    task_id: str
    input_responses: dict[str, Any] | None = None


def fields(task: Task, generation: str, detail: bool = True) -> dict[str, Any]:
    """The task as its generation's tasks/get shows it (`detail`: with the result or error it ended with)."""
    out: dict[str, Any] = {"taskId": task.id, "status": task.status}
    if task.message:
        out["statusMessage"] = task.message
    out["createdAt"], out["lastUpdatedAt"] = iso_time(task.created), iso_time(task.updated)
    if generation == MODERN:
        out["ttlMs"], out["pollIntervalMs"] = task.ttl_ms, POLL_INTERVAL_MS
        if detail and task.status == COMPLETED and task.result is not None:
            out["result"] = task.result
        elif detail and task.status == FAILED and task.error is not None:
            out["error"] = task.error
    else:
        out["ttl"], out["pollInterval"] = task.ttl_ms, POLL_INTERVAL_MS
    return out


def check_ttl(params: Any) -> None:
    """A task's ttl that is no whole number is refused with words (the SDK's own check says only
    "Invalid request parameters"); a whole one, however odd, is bounded where the task is made."""
    task = params.get("task") if isinstance(params, dict) else None
    ttl = task.get("ttl") if isinstance(task, dict) else None
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int)):
        raise MCPError(INVALID_PARAMS, (
            f"task.ttl must be a whole number of milliseconds (or left out for wisp's own), got {ttl!r:.40}; "
            f"wisp keeps a result from {MIN_TTL_MS} ms up to WISP_TASK_TTL"
        ))


def iso_time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def is_modern(ctx: ServerRequestContext[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def declared(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The task generation the requesting client declared support for, if any: 2026-07-28 by the
    extension in this request's capabilities, the handshake generations by `tasks` in the
    capabilities of `initialize`."""
    caps = ctx.session.client_capabilities
    if caps is None:
        return None
    if is_modern(ctx):
        return MODERN if EXTENSION in (caps.extensions or {}) else None
    return LEGACY if caps.tasks is not None else None


def owner(ctx: ServerRequestContext[Any, Any]) -> tuple[Any, ...]:
    """Whose task this is. stdio: the one client of this process. HTTP: the bearer token, and
    for the handshake generation also the session (a 2026-07-28 client has none)."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return ("stdio",)
    token = hashlib.sha256(headers.get("authorization", "").encode("latin-1", "replace")).hexdigest()
    return ("http", token, None if is_modern(ctx) else headers.get("mcp-session-id"))
