"""Progress costs what it says (issue 45.9): with a progress token, a large streamed answer's
progress frames and notifications carry a bounded preview (the tail of the answer so far) and
its length, at most one frame per the core's interval, never the whole answer again; and they
still show the answer growing."""

from __future__ import annotations

import json
import time

from harness import core_exchange, ok, wisp
from unruly_server import Unruly
from wisp_shim.core import protocol
from wisp_shim.facts import PROGRESS_INTERVAL_S, PROGRESS_PREVIEW_CODE_POINTS
from wisp_shim.mcp.tools.respond import PROGRESS_MESSAGE_CHARS

# About a million code points in 70,000 deltas, with two- and four-byte characters in each, so
# that code points, bytes and characters are not the same count.
PIECES = [f"{k:06d}:é𝄞 word " for k in range(70_000)]
ANSWER = "".join(PIECES)
# A preview of 400 code points is at most 1,600 bytes of UTF-8; the rest of a frame is small.
FRAME_BYTES = 4 * PROGRESS_PREVIEW_CODE_POINTS + 200


def test_progress_frames_carry_a_bounded_tail_and_the_length_so_far():
    with Unruly(pieces=PIECES) as server:
        started = time.monotonic()
        frames = core_exchange(["--backend", "openai", "--endpoint", server.endpoint],
                               protocol.encode(protocol.Respond(id=1, prompt="a long one", progress=True)))
        elapsed = time.monotonic() - started
    reply = next(f for f in frames if f.get("event") == "reply")
    assert reply["ok"] and reply["result"]["text"] == ANSWER, str(reply)[:300]
    progress = [f for f in frames if f.get("event") == "progress"]
    assert progress, "no progress frame for a streamed answer"
    chars = [f["chars"] for f in progress]
    assert chars == sorted(set(chars)) and 0 < chars[-1] <= len(ANSWER), chars
    for f in progress:
        # The preview is the tail of the answer as far as it had come, in code points.
        assert f["text"] == ANSWER[: f["chars"]][-PROGRESS_PREVIEW_CODE_POINTS:], (f["chars"], f["text"][:40])
        assert len(json.dumps(f, ensure_ascii=False).encode()) <= FRAME_BYTES, f["chars"]
    # At most one frame per interval over the whole exchange (process start included, so generous).
    assert len(progress) <= elapsed / PROGRESS_INTERVAL_S + 1, (len(progress), elapsed)
    # What the progress cost on the pipe, against the answer it reported on: a whole-answer frame
    # per delta came to gigabytes here.
    assert sum(len(f["text"].encode()) for f in progress) <= len(progress) * 4 * PROGRESS_PREVIEW_CODE_POINTS


async def test_notifications_of_a_large_answer_are_short_and_show_it_growing():
    seen: list[tuple[float, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message or ""))

    with Unruly(pieces=PIECES) as server:
        async with wisp("--endpoint", server.endpoint, backend="openai") as c:
            r = ok(await c.call_tool("respond", {"prompt": "a long one"}, progress_callback=on_progress))
    assert r["text"] == ANSWER
    writing = [m for _, m in seen if m.startswith("writing: ")]
    assert writing, seen
    assert [p for p, _ in seen] == sorted({p for p, _ in seen})  # strictly increasing
    for m in writing:
        assert len(m) <= PROGRESS_MESSAGE_CHARS, len(m)
        # "writing: N tokens, M characters: …tail": the tail is the answer's as far as M.
        head, _, tail = m.partition(" characters: ")
        so_far = int(head.rsplit(" ", 1)[1].replace(",", ""))
        assert 0 < so_far <= len(ANSWER), m
        assert " ".join(ANSWER[:so_far].split()).endswith(tail.lstrip("…")), m
