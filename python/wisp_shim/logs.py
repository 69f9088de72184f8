"""The shim's logging: to stderr only, and never blocking the event loop.

A client that never reads the stderr pipe it gave wisp fills it (64 KiB on Linux), and a plain
StreamHandler would then block the whole shim in its write. So records are formatted at once,
queued in a bounded buffer, and written to fd 2 by a thread of its own; when the buffer is full
a line is dropped and counted, and the next line that gets through is preceded by a note of how
many were lost.

Why a thread and not O_NONBLOCK on fd 2: that flag belongs to the open file description, shared
with wisp-core, the local model server and usually the client's terminal or log pipe; setting it
would make their blocking writes fail with EAGAIN, and it would outlive the shim.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading

FORMAT = "wisp %(levelname)s %(name)s: %(message)s"
# Queued bytes at most: ample for any burst a healthy stderr drains.
MAX_QUEUED_BYTES = 256 * 1024
# A longer line is cut: one huge message must not take the whole buffer.
MAX_LINE_BYTES = 8 * 1024
# How long logging.shutdown() waits for queued lines to reach stderr before the shim exits.
FLUSH_GRACE_S = 0.5


class BufferedStderrHandler(logging.Handler):
    """A logging handler whose emit never waits on stderr (see the module's docstring)."""

    def __init__(self, fd: int = 2, max_bytes: int = MAX_QUEUED_BYTES) -> None:
        super().__init__()
        self._fd = fd
        self._max_bytes = max_bytes
        self._cond = threading.Condition(threading.Lock())
        self._lines: collections.deque[bytes] = collections.deque()
        self._bytes = 0
        self._writing = False
        self.dropped = 0  # lines dropped since the last note said so
        self._thread = threading.Thread(target=self._run, name="wisp log writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record).encode("utf-8", "replace")
        except Exception:
            line = f"wisp ERROR wisp.logs: could not format a log record of {record.name}: {record.msg!r:.200}".encode()
        self.post(line)

    def post(self, line: bytes) -> None:
        if len(line) > MAX_LINE_BYTES:
            line = line[:MAX_LINE_BYTES] + " …(cut)".encode()
        line += b"\n"
        with self._cond:
            notice = (f"wisp WARNING wisp.logs: {self.dropped} log line(s) dropped: stderr was not being "
                      "read\n".encode() if self.dropped else b"")
            if self._bytes + len(notice) + len(line) > self._max_bytes:
                self.dropped += 1
                return
            if notice:
                self._lines.append(notice)
                self.dropped = 0
            self._lines.append(line)
            self._bytes += len(notice) + len(line)
            self._cond.notify_all()

    def handleError(self, record: logging.LogRecord) -> None:
        # The default prints a traceback to sys.stderr, a blocking write: dropped like a line instead.
        with self._cond:
            self.dropped += 1

    def flush(self, timeout: float = FLUSH_GRACE_S) -> bool:  # type: ignore[override]  # logging calls flush()
        """Waits at most `timeout` for every queued line to be written; True when they were."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._lines and not self._writing, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._lines))
                data = b"".join(self._lines)
                self._lines.clear()
                self._bytes = 0
                self._writing = True
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError:
                pass  # stderr closed or broken: nobody can read these lines
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def setup(level: str) -> BufferedStderrHandler:
    """The shim's logging, at `level` (debug, info, warning, error)."""
    handler = BufferedStderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # warnings.warn writes to sys.stderr by itself; through logging, it waits on nothing either.
    logging.captureWarnings(True)
    return handler


def say(line: str, prefix: str = "") -> None:
    """A one-off command's report, for a person (`--install-local-model`, the local model's own
    command): stderr at once, since their stdout is for scripts and no event loop runs to block."""
    sys.stderr.write(f"{prefix}{line}\n")
    sys.stderr.flush()
