"""A fake wisp-core for fault tests (stdlib only), selected with the shim's --core flag
through a small wrapper script.

It speaks pipe protocol 2 well enough to serve `respond` like the echo backend ("echo N: P"
per thread), `close_thread` and `status`, until a prompt asks it to misbehave:

  !garbage     write a frame whose payload is not JSON, then wait
  !oversized   write a length prefix of 0x7fffffff (over the 16 MiB limit), then wait
  !truncated   write a length prefix of 100 and 10 bytes of payload, then exit 0
  !badjson     write a frame that is JSON but no message of the protocol, then wait
  !badresult   reply ok with a RespondResult that lacks required fields, then go on serving
  !wrongresult reply ok with a CloseThreadResult (a result for another op), then go on serving
  !evicted-at-once  reply (creating the thread) and, in the same write, an `evicted` event
               for that very thread, as when another call evicts it right after
  !stall       stop reading and answering (pings included), as a wedged core would; with
               WISP_FAKE_CORE_LOG, first create that file's name + ".stalled", so a test knows

`--max-threads N` (default 32) is honoured like the real core's LRU: creating a thread past
it evicts the least recently used one and sends an `evicted` event before the reply.

Each start appends its pid to the file named by WISP_FAKE_CORE_LOG, so a test can count
restarts.
"""

import json
import os
import struct
import sys
import time

from wisp_shim.version import version

out = sys.stdout.buffer
inp = sys.stdin.buffer


def write(payload: bytes) -> None:
    out.write(struct.pack(">I", len(payload)) + payload)
    out.flush()


def send(obj: dict) -> None:
    write(json.dumps(obj).encode())


def reply(rid: int, op: str, result: dict) -> dict:
    """An ok reply, tagged as the core tags it: `event` on the message, `op` on its result."""
    return {"id": rid, "event": "reply", "ok": True, "result": {"op": op, **result}}


def read_exact(n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = inp.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def hang() -> None:
    # Until the shim kills us or closes our stdin.
    inp.read()
    sys.exit(0)


def main() -> None:
    log = os.environ.get("WISP_FAKE_CORE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
    # The shim refuses a core of another version; this one claims the shim's own, or
    # WISP_FAKE_CORE_VERSION's (empty: none, as a core built before cores stated theirs).
    claimed = os.environ.get("WISP_FAKE_CORE_VERSION", version())
    ready = {"id": 0, "event": "ready", "protocol": 2, "backend": "fake", "model": "fake", "pid": os.getpid()}
    send({**ready, "version": claimed} if claimed else ready)
    args = sys.argv[1:]
    capacity = int(args[args.index("--max-threads") + 1]) if "--max-threads" in args else 32
    threads: dict[str, int] = {}  # insertion order is recency: least recently used first
    while True:
        head = read_exact(4)
        if head is None:
            return
        (n,) = struct.unpack(">I", head)
        body = read_exact(n)
        if body is None:
            return
        req = json.loads(body)
        rid, op = req["id"], req["op"]
        if op == "respond":
            prompt = req["prompt"]
            if prompt.startswith("!garbage"):
                write(b"\x00\x01this is not json\xff")
                hang()
            if prompt.startswith("!oversized"):
                out.write(struct.pack(">I", 0x7FFFFFFF) + b"{")
                out.flush()
                hang()
            if prompt.startswith("!truncated"):
                out.write(struct.pack(">I", 100) + b'{"id": 1, ')
                out.flush()
                sys.exit(0)
            if prompt.startswith("!badjson"):
                send({"hello": "world"})
                hang()
            if prompt.startswith("!badresult"):
                send(reply(rid, "respond", {"thread_id": req.get("thread_id") or "x", "text": "half a result"}))
                continue
            if prompt.startswith("!wrongresult"):
                send(reply(rid, "close_thread", {"thread_id": req.get("thread_id") or "x", "closed": True}))
                continue
            if prompt.startswith("!evicted-at-once"):
                tid = req["thread_id"]
                answer = reply(rid, "respond", {"thread_id": tid, "created": True, "text": f"echo 1: {prompt}",
                                                "condensed": False, "turns": 1, "dropped": 0})
                both = [json.dumps(answer).encode(), json.dumps({"id": rid + 1000000, "event": "evicted", "thread_id": tid}).encode()]
                out.write(b"".join(struct.pack(">I", len(b)) + b for b in both))
                out.flush()
                continue
            if prompt.startswith("!stall"):
                if log:
                    open(f"{log}.stalled", "a").close()
                while True:
                    time.sleep(3600)  # kept: the wedge is this fake's behaviour
            if prompt.startswith("!sleep"):
                time.sleep(int(prompt.split()[1]) / 1000)  # kept: a slow reply is this fake's behaviour
            tid = req.get("thread_id") or f"fake{rid}"
            created = tid not in threads
            if created and len(threads) >= capacity:
                victim = next(iter(threads))
                del threads[victim]
                send({"id": rid, "event": "evicted", "thread_id": victim})
            threads[tid] = threads.pop(tid, 0) + 1
            send(reply(rid, "respond", {
                "thread_id": tid, "created": created, "text": f"echo {threads[tid]}: {prompt}",
                "condensed": False, "turns": threads[tid], "dropped": 0}))
        elif op == "close_thread":
            send(reply(rid, "close_thread", {"thread_id": req["thread_id"], "closed": threads.pop(req["thread_id"], None) is not None}))
        elif op == "status":
            send(reply(rid, "status", {
                "backend": "fake", "model": "fake", "available": True, "context_size": 4096, "max_threads": 32,
                "max_queue": 16, "threads": [{"thread_id": t, "turns": n, "pending": 0} for t, n in threads.items()]}))
        elif op == "cancel":
            send(reply(rid, "cancel", {"cancelled": False}))
        elif op == "ping":
            send(reply(rid, "ping", {}))


if __name__ == "__main__":
    main()
