"""`make bench`'s `progress` section: what a progress token costs a large streamed answer.

  progress_overhead_ratio   a 1 MB answer streamed by a scripted OpenAI-compatible server (70,000
                            deltas, written at once: tests/python/unruly_server.py) through wisp,
                            time with a progress token / without; calls interleaved, medians
  progress_notifications    notifications the client got for one such answer (median)

Each progress frame carries a bounded preview of the answer (the core's facts say how much, and
how often), so the token costs a few notifications, not the answer again per delta.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from clients import REPO, mcp_client, wisp_argv

sys.path.insert(0, str(REPO / "tests" / "python"))
from unruly_server import Unruly  # noqa: E402

PROGRESS_TARGETS = {"progress_overhead_ratio": (1.5, "max")}
PROGRESS_ROWS = [
    ("progress_overhead_ratio", "1 MB streamed answer, with a progress token / without", "{:.2f}"),
    ("progress_with_token_ms", "  with a token (ms)", "{:.0f}"),
    ("progress_without_token_ms", "  without (ms)", "{:.0f}"),
    ("progress_notifications", "  notifications for it", "{:.0f}"),
]

PIECES = [f"{k:06d} streamed " for k in range(70_000)]  # 15 characters each: 1.05 MB
ANSWER_BYTES = len("".join(PIECES).encode())


async def _call(c: Any, with_token: bool) -> tuple[float, int]:
    heard = 0

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        nonlocal heard
        heard += 1

    t = time.perf_counter()
    res = await c.call_tool("respond", {"prompt": "a long answer, please"},
                            progress_callback=on_progress if with_token else None)
    elapsed = time.perf_counter() - t
    assert not res.is_error and len(res.structured_content["text"].encode()) == ANSWER_BYTES, str(res)[:300]
    return elapsed, heard


async def progress_section(quick: bool) -> dict[str, Any]:
    repeats = 3 if quick else 9
    with_token: list[float] = []
    without: list[float] = []
    heard: list[int] = []
    with Unruly(pieces=PIECES) as server:
        async with mcp_client(wisp_argv("--endpoint", server.endpoint, backend="openai")) as c:
            await _call(c, False)  # warm: the core's probes, the first connection
            for r in range(repeats):
                # Alternate who goes first, so neither always follows the other.
                for token in (r % 2 == 0, r % 2 != 0):
                    elapsed, n = await _call(c, token)
                    (with_token if token else without).append(elapsed)
                    if token:
                        heard.append(n)
    w, wo = statistics.median(with_token), statistics.median(without)
    print(f"bench: progress: 1 MB answer {w * 1e3:.0f} ms with a token, {wo * 1e3:.0f} ms without, "
          f"{statistics.median(heard):.0f} notifications", file=sys.stderr, flush=True)
    return {
        "progress_overhead_ratio": w / wo,
        "progress_with_token_ms": w * 1e3,
        "progress_without_token_ms": wo * 1e3,
        "progress_notifications": statistics.median(heard),
        "_runs": {"progress": {"with_token_s": with_token, "without_s": without, "notifications": heard}},
    }
