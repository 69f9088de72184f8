"""`respond`'s `files` end to end: a real MCP client, the shim, the core, the echo backend's
"Attached files" contract (reply `echo N: P`, then `file F: first line` per file)."""

from __future__ import annotations

import pytest

from harness import error_text, ok, wisp
from harness import ESCAPES, workspace  # noqa: F401 (the fixture)

pytestmark = pytest.mark.anyio


async def respond(client, **args):
    return await client.call_tool("respond", args)


async def test_files_are_given_to_the_model_with_their_paths(workspace):
    absolute = str(workspace / "sub" / "b.txt")
    async with wisp("--root", str(workspace)) as client:
        r = ok(await respond(client, prompt="summarise these", thread_id="t", files=["a.txt", absolute]))
        assert r["text"] == f"echo 1: summarise these\nfile a.txt: line one\nfile {absolute}: deep needle"
        # The thread goes on; the files were part of turn 1 only.
        r = ok(await respond(client, prompt="and now?", thread_id="t"))
        assert r["text"] == "echo 2: and now?" and r["turns"] == 2
        # A continuing call may attach files too, and directives still come from the prompt.
        r = ok(await respond(client, prompt="!tool read_file {}", thread_id="t", files=["sub/b.txt"]))
        assert r["text"].startswith("echo 3: tool read_file failed: ") and r["text"].endswith("\nfile sub/b.txt: deep needle")


async def test_the_escape_table_is_refused_for_files_too(workspace):
    paths = [args["path"] for _, args, _ in ESCAPES if isinstance(args, dict) and isinstance(args.get("path"), str)]
    assert len(paths) >= 10
    escapes = 0
    async with wisp("--root", str(workspace)) as client:
        for (name, args, message) in ESCAPES:
            if not (isinstance(args, dict) and isinstance(args.get("path"), str)):
                continue
            result = await respond(client, prompt="read", files=[args["path"]])
            if not result.is_error:
                escapes += 1
                continue
            text = error_text(result)
            assert text.startswith("invalid_argument: files: "), (name, text)
            assert "secret" not in text, (name, text)
            # The directory case says what to do for files rather than for read_file.
            if name != "directory to read_file":
                assert message in text, (name, text)
            assert args["path"].split("\x00")[0] in text or "NUL" in text, (name, text)
        # A refused attachment created no thread and changed none.
        listing = ok(await client.call_tool("list_threads", {}))
        assert listing["threads"] == []
    assert escapes == 0


async def test_limits_are_checked_before_the_model_is_called(tmp_path):
    # A 256-token context: 512 bytes per file, 768 per call, a reply reserve of 64 tokens.
    (tmp_path / "big.txt").write_text("x" * 600 + "\n")
    (tmp_path / "one.txt").write_text("first\n" + "y" * 373 + "\n")
    (tmp_path / "two.txt").write_text("second\n" + "z" * 372 + "\n")
    (tmp_path / "third.txt").write_text("w" * 100 + "\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02")
    async with wisp("--root", str(tmp_path), "--context-size", "256") as client:
        text = error_text(await respond(client, prompt="x", files=["big.txt"]))
        assert "big.txt is over the per-file limit of 512 bytes" in text
        text = error_text(await respond(client, prompt="x", files=["one.txt", "two.txt", "third.txt"]))
        assert "over the per-call limit of 768 bytes" in text and "one.txt (380 bytes)" in text and "third.txt (101 bytes)" in text
        text = error_text(await respond(client, prompt="x", files=["one.txt", "two.txt"]))
        assert text.startswith("context_overflow: files: the attached files do not fit in the model's 256-token context")
        assert "one.txt (" in text and "two.txt (" in text and "tokens)" in text
        assert "binary" in error_text(await respond(client, prompt="x", files=["blob.bin"]))
        assert "directory" in error_text(await respond(client, prompt="x", files=["."]))
        # Nothing reached the model: the first call that fits is turn 1.
        r = ok(await respond(client, prompt="x", thread_id="t", files=["one.txt"]))
        assert r["text"] == "echo 1: x\nfile one.txt: first"


async def test_files_that_fit_only_after_condensing_count_once(tmp_path):
    (tmp_path / "log.txt").write_text("header\n" + "l" * 500 + "\n")
    async with wisp("--root", str(tmp_path), "--context-size", "512") as client:
        for _ in range(3):
            ok(await respond(client, prompt="p" * 400, thread_id="t"))
        r = ok(await respond(client, prompt="summarise", thread_id="t", files=["log.txt"]))
        assert r["condensed"] and r["dropped"] >= 1
        assert r["text"] == f"echo {r['turns']}: summarise\nfile log.txt: header"


async def test_files_schema_is_advertised(workspace):
    async with wisp() as client:
        respond_tool = next(t for t in (await client.list_tools()).tools if t.name == "respond")
        files = respond_tool.input_schema["properties"]["files"]
        assert files["type"] == "array" and "relative" in files["description"] and "root" in files["description"]
        text = error_text(await respond(client, prompt="x", files="a.txt"))
        assert "`files` must be a list of file paths" in text
