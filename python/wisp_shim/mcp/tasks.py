"""`respond` as an MCP task: the call handed off at once, run in the background, polled for and
collected later (or cancelled), in both protocol generations that define tasks.

- 2025-11-25 (the experimental `tasks` capability): a client that declared `tasks` in its
  `initialize` capabilities sees the capability in the answer and `execution.taskSupport:
  "optional"` on `respond`; its `tools/call` with `task: {ttl}` gets a task handle, one without
  `task` is answered plainly. `tasks/get`, `tasks/result` (waits for the end, then answers
  exactly what the call would have: the tool result, tagged with the task), `tasks/list`,
  `tasks/cancel`. Progress goes on with the call's progress token, tagged with the task. The
  task's one status change (from `working`, its handle, to how it ended) is sent as
  `notifications/tasks/status` before any reply that shows it.
- 2026-07-28 (the `io.modelcontextprotocol/tasks` extension): for a request that declares the
  extension the server decides (`decide`); `tasks/get` carries the result once there,
  `tasks/update` and `tasks/cancel` are acknowledged. That generation sends no progress for a
  task: the latest partial text is the task's `statusMessage`. Its `notifications/tasks/status`
  ride only a `subscriptions/listen` stream opened for them, which wisp does not serve: none.

A task is the call: the same checks, the same place in its thread's queue (the handle goes out
only once the call is queued in the core, so a call sent after it runs after it), the same
result, errors included. A cancel is an MCP cancel whose outcome is waited for: the turn is not
kept and the task ends `cancelled`, unless the call had already finished (then nothing changes).

Bounds (README "Tasks"): ids are 192 random bits; a task is visible only to the client that
made it (`owner`); its result is kept until its ttl (at most WISP_TASK_TTL) and then freed (a
task still running then is cancelled: no one could collect it); a client holds at most
WISP_MAX_TASKS tasks running or with a result not yet collected, and all clients together
MAX_TASKS_TOTAL. A collected or cancelled task frees its place at once; its record stays for a
repeated poll until its ttl, or until MAX_TASKS_TOTAL later-freed records push it out. Tasks live in
this process's memory: a restart loses them, and their ids answer "no such task".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    CallToolResult,
    CancelTaskRequestParams,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    PaginatedRequestParams,
    ProgressNotification,
    ProgressNotificationParams,
    TaskStatusNotification,
    TaskStatusNotificationParams,
    TextContent,
)
from mcp_types import methods as wire

from .. import errors
from .task_records import (
    CANCELLED,
    COMPLETED,
    EXTENSION,
    FAILED,
    HEADER_MISMATCH,
    IMMEDIATE_RESPONSE,
    LEGACY,
    LEGACY_CAPABILITY,
    MAX_TASKS_TOTAL,
    MIN_TTL_MS,
    MODERN,
    RELATED_TASK,
    TASK_CANCELLED,
    TASK_SUPPORT,
    TASKS_PER_PAGE,
    TERMINAL,
    TOO_MANY_TASKS,
    Job,
    Task,
    TaskLimits,
    UpdateParams,
    check_ttl,
    declared,
    fields,
    is_modern,
    owner,
)

log = logging.getLogger("wisp.tasks")

# Where a handshake-era task handle travels from the tools/call handler to the middleware
# (TaskMiddleware): the SDK checks a handler's tools/call result against that era's
# CallToolResult, which a CreateTaskResult is not.
_LEGACY_HANDLE: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "wisp_legacy_task_handle", default=None
)


class Tasks:
    """Every task of one wisp, by owner."""

    def __init__(self, limits: TaskLimits, placement: Callable[[str | None], Awaitable[tuple[str, bool]]],
                 task_tools: frozenset[str]) -> None:
        self.limits = limits
        # The tools that may run as a task (those whose module declares task steps: respond).
        self.task_tools = task_tools
        self._placement = placement
        self._tasks: dict[str, Task] = {}
        self._held: dict[tuple[Any, ...], int] = {}
        self._live = 0
        # Collected or cancelled tasks, oldest first: kept for a repeated poll, bounded in number.
        self._released: dict[str, Task] = {}

    # --- the rule and the handle ---------------------------------------------------------

    def wanted(self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams) -> str | None:
        """The generation under which this call may become a task (None: plain). Only the
        task_tools run as a task; the other tools' taskSupport is "forbidden", and asking for one
        as a task is answered as the 2025-11-25 spec says."""
        generation = declared(ctx)
        if generation == LEGACY and params.task is None:
            return None  # declared, but asked for a plain call
        if params.name not in self.task_tools:
            if generation == LEGACY:
                raise MCPError(METHOD_NOT_FOUND, (
                    f"{params.name} does not run as a task (its execution.taskSupport is forbidden): "
                    "call it without `task`"
                ))
            return None
        return generation

    async def decide(self, thread_id: str | None) -> bool:
        """The 2026-07-28 rule, where the server decides: a task when the call cannot start at
        once (another call on its thread runs or waits) or when a model, not echo, answers it."""
        try:
            backend, behind = await self._placement(thread_id)
        except errors.ShimError:
            return False  # no core to run it: the plain call says why, as a tool error
        return behind or backend != "echo"

    async def call(self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams, generation: str,
                   job: Job[Any]) -> CallToolResult | dict[str, Any]:
        prepared = await job.prepare()
        try:
            if isinstance(prepared, CallToolResult):
                if generation == MODERN:
                    return prepared  # refused before it reached a model: nothing to wait for
            elif generation == MODERN and not await self.decide(job.thread_id(prepared)):
                return await job.run(prepared, job.plain_progress, None, None)
            # 2026-07-28 ignores a `task` on the call (that generation has none): wisp's ttl applies.
            ttl = params.task.ttl if generation == LEGACY and params.task is not None else None
            task = self._create(owner(ctx), generation, ttl)
        except BaseException:
            if not isinstance(prepared, CallToolResult):
                job.abandon(prepared)  # refused, or cancelled while deciding: it holds no place on its thread
            raise
        # The handle shows the task as created (a task begins `working`), however soon it ends.
        seed = fields(task, generation, detail=False)
        token = ctx.meta.get("progress_token") if ctx.meta else None
        queued = asyncio.Event()
        task.runner = asyncio.get_running_loop().create_task(
            self._run(task, job, prepared, self._progress(ctx, task, token), queued.set, ctx.session),
            name=f"wisp task {task.id[:8]}",
        )
        # The handle goes out once the call has its place in its thread's queue (or has ended).
        try:
            await queued.wait()
        except asyncio.CancelledError:
            # The tools/call itself was cancelled: no one will ever know this task's id.
            if not task.stop.done():
                task.stop.set_result(None)
            self._forget(task)
            raise
        finally:
            task.announced.set()
        log.info("task %s… created (%s, ttl %d ms)", task.id[:8], generation, task.ttl_ms)
        if generation == MODERN:
            return {"resultType": "task", **seed}
        box = _LEGACY_HANDLE.get()
        if box is None:
            raise MCPError(INTERNAL_ERROR, "wisp's task middleware is not installed")
        box.append({
            "task": seed,
            "_meta": {IMMEDIATE_RESPONSE: (
                f"wisp is running this respond call in the background as task {task.id}; "
                "its result (the reply and thread_id) comes when the task completes."
            )},
        })
        return CallToolResult(content=[])  # replaced by the handle above (TaskMiddleware)

    def _create(self, who: tuple[Any, ...], generation: str, ttl_ms: int | None) -> Task:
        held = self._held.get(who, 0)
        kept = "running, or finished with a result not yet collected"
        if held >= self.limits.per_client:
            full = f"this client holds {held} tasks ({kept}), wisp's limit per client (WISP_MAX_TASKS)"
        elif self._live >= MAX_TASKS_TOTAL:
            full = f"wisp's clients hold {MAX_TASKS_TOTAL} tasks ({kept}), its limit for all clients together"
        else:
            full = None
        if full is not None:
            raise MCPError(TOO_MANY_TASKS, (
                f"{full}; this call was not started. Collect (tasks/result, or tasks/get once it ended) or cancel "
                "earlier tasks, wait for their ttl to pass, or call without a task."
            ))
        most_ms = int(self.limits.ttl_s * 1000)
        ttl = most_ms if ttl_ms is None else max(MIN_TTL_MS, min(int(ttl_ms), most_ms))
        task = Task(secrets.token_urlsafe(24), who, generation, ttl)
        self._tasks[task.id] = task
        self._held[who] = held + 1
        self._live += 1
        task.expiry = asyncio.get_running_loop().call_later(ttl / 1000, self._expire, task)
        return task

    def _uncount(self, task: Task) -> None:
        if not task.counted:
            return
        task.counted = False
        self._live -= 1
        left = self._held.get(task.owner, 1) - 1
        if left:
            self._held[task.owner] = left
        else:
            self._held.pop(task.owner, None)

    def _release(self, task: Task) -> None:
        """The task's place is free (its result delivered, or it was cancelled); its record stays."""
        if not task.counted or task.id not in self._tasks:
            return
        self._uncount(task)
        self._released[task.id] = task
        while len(self._released) > MAX_TASKS_TOTAL:
            self._forget(next(iter(self._released.values())))

    def _forget(self, task: Task) -> None:
        if self._tasks.pop(task.id, None) is None:
            return
        self._uncount(task)
        self._released.pop(task.id, None)
        if task.expiry is not None:
            task.expiry.cancel()
        task.result = task.error = None

    def _expire(self, task: Task) -> None:
        log.info("task %s… expired (%s)", task.id[:8], task.status)
        if task.status not in TERMINAL and not task.stop.done():
            task.stop.set_result(None)  # no one can collect it any more: the model may stop
        self._forget(task)

    # --- running ------------------------------------------------------------------------

    def _progress(self, ctx: ServerRequestContext[Any, Any], task: Task,
                  token: str | int | None) -> Callable[[float, str], Awaitable[None]]:
        session = ctx.session
        tagged = token is not None and task.generation == LEGACY

        async def send(value: float, message: str) -> None:
            task.touch(message=message)
            if tagged:
                # The call's own request has been answered: its stream is gone, so this goes on
                # the connection's (stdio: stdout; HTTP: the session's GET stream).
                await session.send_notification(ProgressNotification(params=ProgressNotificationParams(
                    progress_token=token, progress=value, message=message, _meta={RELATED_TASK: {"taskId": task.id}},
                )))

        return send

    async def _run(self, task: Task, job: Job[Any], prepared: Any, progress: Callable[[float, str], Awaitable[None]],
                   queued: Callable[[], None], session: Any) -> None:
        """The call (or the tool error that refused it), then the end told, then `done`."""
        try:
            result = prepared if isinstance(prepared, CallToolResult) else await job.run(
                prepared, progress, task.stop, queued)
            self._settle(task, result)
        except Exception as exc:  # the tool's own errors are results; this is a bug
            log.exception("task %s… failed", task.id[:8])
            task.error = {"code": INTERNAL_ERROR, "message": f"wisp failed unexpectedly ({type(exc).__name__}: {exc})"}
            task.end(FAILED, task.error["message"])
        finally:
            queued()  # ended without a place in the queue (refused, lost, busy…): the handle goes out now
            try:
                await self._tell_end(task, session)
            finally:
                task.done.set()

    async def _tell_end(self, task: Task, session: Any) -> None:
        """notifications/tasks/status (2025-11-25) for the task's one status change, once its handle
        is out and before any reply shows the end; nothing for a task whose record is gone."""
        if task.generation != LEGACY or task.status not in TERMINAL:
            return
        await task.announced.wait()
        if self._tasks.get(task.id) is not task:
            return
        params = TaskStatusNotificationParams.model_validate(fields(task, LEGACY))
        # Sent on the connection, as progress is: a client that went away is no failure of the task.
        with contextlib.suppress(Exception):
            await session.send_notification(TaskStatusNotification(params=params))

    def _settle(self, task: Task, result: CallToolResult) -> None:
        text = "\n".join(b.text for b in result.content if isinstance(b, TextContent))
        if result.is_error and task.stop.done() and text.startswith(f"{errors.CANCELLED}:"):
            task.end(CANCELLED, "The task was cancelled; the call's turn was not kept.")
            self._release(task)  # nothing to collect
            return
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        task.result = wire.serialize_server_result("tools/call", task.generation, dumped)
        if result.is_error:
            # 2025-11-25: a tool error fails the task; 2026-07-28: it completes with that result.
            task.end(FAILED if task.generation == LEGACY else COMPLETED, text[:200])
        else:
            task.end(COMPLETED, "The call completed.")

    # --- the tasks/* methods --------------------------------------------------------------

    def _find(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None or task.owner != owner(ctx):
            raise MCPError(INVALID_PARAMS, (
                "Failed to retrieve task: no task with this id (wisp keeps a task until its ttl, in memory only: "
                "it is unknown, expired, another client's, or was lost when wisp restarted)"
            ))
        return task

    def _check(self, ctx: ServerRequestContext[Any, Any], method: str, task_id: str | None = None) -> str:
        """The generation a tasks/* request is served under, or the error that answers it."""
        generation = declared(ctx)
        modern = is_modern(ctx)
        if modern and method in ("tasks/result", "tasks/list") or not modern and method == "tasks/update":
            raise MCPError(METHOD_NOT_FOUND, "Method not found", method)
        if generation is None:
            if modern:
                raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability",
                               {"requiredCapabilities": {"extensions": {EXTENSION: {}}}})
            raise MCPError(METHOD_NOT_FOUND, "Method not found", method)  # as to a client that never asked
        headers = getattr(ctx.request, "headers", None)
        if modern and task_id is not None and headers is not None:
            name = headers.get("mcp-name")
            if name is not None and name != task_id:
                raise MCPError(HEADER_MISMATCH, "Mcp-Name header does not match the request's taskId")
        return generation

    async def get(self, ctx: ServerRequestContext[Any, Any], params: GetTaskRequestParams) -> dict[str, Any]:
        generation = self._check(ctx, "tasks/get", params.task_id)
        task = self._find(ctx, params.task_id)
        shown = fields(task, generation)
        if generation != MODERN:
            return shown
        if task.status in TERMINAL:
            self._release(task)  # this generation's result travels in tasks/get
        return {"resultType": "complete", **shown}

    async def result(self, ctx: ServerRequestContext[Any, Any], params: GetTaskPayloadRequestParams) -> dict[str, Any]:
        self._check(ctx, "tasks/result", params.task_id)
        task = self._find(ctx, params.task_id)
        await task.done.wait()
        self._release(task)
        related = {RELATED_TASK: {"taskId": task.id}}
        if task.status == CANCELLED:
            raise MCPError(TASK_CANCELLED, "The task was cancelled; the call's turn was not kept.", related)
        if task.result is None:
            error = task.error or {"code": INTERNAL_ERROR, "message": "the task's result was freed (its ttl passed)"}
            raise MCPError(error["code"], error["message"], related)
        return {**task.result, "_meta": {**task.result.get("_meta", {}), **related}}

    async def list(self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams) -> dict[str, Any]:
        generation = self._check(ctx, "tasks/list")
        mine = [t for t in self._tasks.values() if t.owner == owner(ctx)]
        start = 0
        if params.cursor is not None:
            found = next((i for i, t in enumerate(mine) if t.id == params.cursor), None)
            if found is None:
                raise MCPError(INVALID_PARAMS, "Invalid cursor: it names no task of this client (it may have expired)")
            start = found
        page = mine[start:start + TASKS_PER_PAGE]
        out: dict[str, Any] = {"tasks": [fields(t, generation) for t in page]}
        if start + TASKS_PER_PAGE < len(mine):
            out["nextCursor"] = mine[start + TASKS_PER_PAGE].id
        return out

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: CancelTaskRequestParams) -> dict[str, Any]:
        generation = self._check(ctx, "tasks/cancel", params.task_id)
        task = self._find(ctx, params.task_id)
        ended = task.status in TERMINAL
        if not ended:
            if not task.stop.done():
                task.stop.set_result(None)
            # The core's verdict: cancelled (the turn not kept), or the result that came first.
            await task.done.wait()
        if generation == MODERN:
            return {}
        if ended or task.status != CANCELLED:  # a cancelled task too: the spec refuses any ended one
            raise MCPError(INVALID_PARAMS, f"Cannot cancel task: already in terminal status '{task.status}'")
        return fields(task, generation)

    async def update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
        self._check(ctx, "tasks/update", params.task_id)
        self._find(ctx, params.task_id)
        return {}  # a respond task never asks its client for input: every response is for no request

    def install(self, server: Any) -> None:
        """The tasks/* methods and the middleware on the SDK's low-level Server."""
        server.add_request_handler("tasks/get", GetTaskRequestParams, self.get)
        server.add_request_handler("tasks/result", GetTaskPayloadRequestParams, self.result)
        server.add_request_handler("tasks/list", PaginatedRequestParams, self.list)
        server.add_request_handler("tasks/cancel", CancelTaskRequestParams, self.cancel)
        server.add_request_handler("tasks/update", UpdateParams, self.update)
        server.extensions[EXTENSION] = {}
        server.middleware.append(TaskMiddleware(self.task_tools))


class TaskMiddleware:
    """What the handshake generation's tasks need around the SDK's handlers: `initialize` and
    `tools/list` tell a client that declared tasks that wisp has them (and only such a client:
    the others see what they always saw), and a task-augmented `tools/call` answers with its
    handle (CreateTaskResult) in place of the tool result the SDK expects there."""

    def __init__(self, task_tools: frozenset[str]) -> None:
        self.task_tools = task_tools

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        method = ctx.method
        if method == "tools/call":
            check_ttl(ctx.params)
            box: list[dict[str, Any]] = []
            reset = _LEGACY_HANDLE.set(box)
            try:
                result = await call_next(ctx)
            finally:
                _LEGACY_HANDLE.reset(reset)
            return box[0] if box else result
        result = await call_next(ctx)
        if is_modern(ctx) or not isinstance(result, dict):
            return result
        if method == "initialize":
            caps = (ctx.params or {}).get("capabilities")
            declares = isinstance(caps, dict) and isinstance(caps.get("tasks"), dict)
            if declares and isinstance(result.get("capabilities"), dict):
                result = {**result, "capabilities": {**result["capabilities"], "tasks": LEGACY_CAPABILITY}}
        elif method == "tools/list" and declared(ctx) == LEGACY and isinstance(result.get("tools"), list):
            result = {**result, "tools": [
                {**t, "execution": TASK_SUPPORT} if isinstance(t, dict) and t.get("name") in self.task_tools
                else t
                for t in result["tools"]
            ]}
        return result

