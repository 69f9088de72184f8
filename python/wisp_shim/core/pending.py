"""One call waiting on the core: what the client (core/client.py) keeps for it and the core's run
(core/process.py) holds until its reply comes. Its own module, so that neither of those two
imports the other for it.
"""

from __future__ import annotations

import asyncio

from . import protocol


class PendingCall:
    __slots__ = ("id", "thread_id", "result_type", "future", "late", "latest", "stage", "newest", "progress_event",
                 "sent", "answered", "in_task")

    def __init__(self, call_id: int, thread_id: str | None, want_progress: bool,
                 result_type: type[protocol.PipeResult]) -> None:
        self.id = call_id
        self.thread_id = thread_id
        # What an ok reply's result must be (checked as the frame arrives: dispatch).
        self.result_type = result_type
        self.future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        # Set once the call's time limit passed: its own reply may still come, for a moment.
        self.late: asyncio.Future[Answer] | None = None
        # The newest Progress: tokens, characters so far and the preview (the answer's tail).
        self.latest: tuple[int, int, str] | None = None
        # What the call last said it waits for (Stage: stage, count), and which of the two came last.
        self.stage: tuple[str, int | None] | None = None
        self.newest: str = "stage"
        self.progress_event = asyncio.Event() if want_progress else None
        # Tokens of the last progress notification sent: each must go higher.
        self.sent = 0
        # Set when the reply is in, so the progress pump flushes and stops.
        self.answered = asyncio.Event() if want_progress else None
        # A task's call: its failure reaches its client only when the task is collected, maybe
        # after that client's next call on the thread.
        self.in_task = False


# A reply whose result, when it is ok, is the one its call wants.
Answer = protocol.Reply
