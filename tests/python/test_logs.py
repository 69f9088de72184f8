"""The shim's log (logs.py): a stderr nobody reads never holds up a log call; what does not fit
the buffer is dropped, and the next line that gets through says how many were lost."""

from __future__ import annotations

import logging
import os
import re
import time

from wisp_shim.logs import MAX_LINE_BYTES, BufferedStderrHandler


def _drain(fd: int, out: bytearray, done, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not done(out.decode(errors="replace")) and time.monotonic() < end:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.01)  # the poll's interval
            continue
        out += chunk


def _logger(handler: logging.Handler, name: str) -> logging.Logger:
    log = logging.getLogger(name)
    log.propagate = False
    log.handlers = [handler]
    log.setLevel(logging.INFO)
    return log


def test_a_pipe_nobody_reads_drops_lines_and_the_count_follows_once_it_drains():
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        handler = BufferedStderrHandler(fd=w, max_bytes=4096)
        log = _logger(handler, "wisp.test.drops")
        posted = 5000
        start = time.monotonic()
        for i in range(posted):
            log.info("line %d %s", i, "x" * 80)
            if i % 50 == 0:
                time.sleep(0.001)  # kept: the writer gets the GIL and fills the pipe: the drops then are the pipe's
        # Nobody read: a log call that waited on the pipe would not have returned at all.
        assert time.monotonic() - start < 5
        out = bytearray()
        _drain(r, out, lambda _: handler.flush(0.001))
        _drain(r, out, lambda _: True)
        log.info("after")
        _drain(r, out, lambda text: text.endswith("after\n"))
        lines = out.decode().splitlines()
        written = sum(1 for x in lines if x.startswith("line "))
        counts = [int(n) for n in re.findall(r"^wisp WARNING wisp\.logs: (\d+) log line\(s\) dropped: stderr was not being read$", out.decode(), re.M)]
        assert 0 < written < posted
        assert counts and all(counts) and sum(counts) == posted - written, (counts, written)
        assert lines[-1] == "after" and "dropped" in lines[-2]
    finally:
        os.close(r)


def test_a_long_line_is_cut_and_a_bad_record_is_not_a_blocking_traceback():
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        handler = BufferedStderrHandler(fd=w)
        log = _logger(handler, "wisp.test.long")
        log.info("y" * 50_000)
        log.info("%d", "not a number")  # a formatting bug: reported as a line, not raised or printed
        out = bytearray()
        _drain(r, out, lambda text: text.count("\n") >= 2)
        first, second = out.decode().splitlines()[:2]
        assert len(first.encode()) <= MAX_LINE_BYTES + 16 and first.endswith("y …(cut)")
        assert "could not format a log record of wisp.test.long" in second
    finally:
        os.close(r)
