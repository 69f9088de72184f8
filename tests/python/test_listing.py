"""list_threads says in structuredContent why threads are not stored (`not_stored`), not only in
its text: no --state-dir, or a state dir wisp could not use; a store in use leaves it out."""

from __future__ import annotations

from harness import ok, text_of, wisp


async def _listing(*args: str) -> tuple[dict, str]:
    async with wisp(*args) as c:
        ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": "t"}))
        r = await c.call_tool("list_threads", {})
        return ok(r), text_of(r)


async def test_without_a_state_dir_the_listing_says_threads_are_not_stored():
    listed, text = await _listing()
    assert "--state-dir" in listed["not_stored"] and "memory" in listed["not_stored"], listed
    assert "state_dir" not in listed
    assert f"threads are not stored: {listed['not_stored']}" in text, text


async def test_a_state_dir_in_use_leaves_not_stored_out(tmp_path):
    listed, text = await _listing("--state-dir", str(tmp_path / "state"))
    assert listed["state_dir"] and "not_stored" not in listed, listed
    assert "not stored" not in text, text


async def test_an_unusable_state_dir_is_named_as_the_reason(tmp_path):
    state = tmp_path / "open"
    state.mkdir()
    state.chmod(0o777)  # others may write there: wisp refuses it and serves in memory
    listed, text = await _listing("--state-dir", str(state))
    assert "chmod 700" in listed["not_stored"] and "state_dir" not in listed, listed
    assert f"threads are not stored: {listed['not_stored']}" in text, text
