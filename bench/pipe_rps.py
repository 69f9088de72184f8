"""Requests per second one pipe carries: wisp-core with the echo backend, no MCP, no shim.

    python bench/pipe_rps.py [--core .build/release/wisp-core] [--calls 20000]

Sends `respond` frames as fast as the core takes them (a writer thread, so reading and
writing overlap) and counts replies, for 1 thread and for 32 threads. Standard library only,
so it measures the core, not a client library.
"""
import argparse
import json
import struct
import subprocess
import sys
import threading
import time


def run(core: str, calls: int, threads: int) -> float:
    p = subprocess.Popen([core, "--backend", "echo", "--max-threads", "64", "--max-queue", str(calls)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout

    def read_frame() -> dict:
        (n,) = struct.unpack(">I", out.read(4))
        return json.loads(out.read(n))

    assert read_frame()["event"] == "ready"
    frames = []
    for i in range(1, calls + 1):
        b = json.dumps({"op": "respond", "id": i, "prompt": "ping", "thread_id": f"t{i % threads}"}).encode()
        frames.append(struct.pack(">I", len(b)) + b)

    def writer() -> None:
        for f in frames:
            p.stdin.write(f)
        p.stdin.flush()

    start = time.perf_counter()
    t = threading.Thread(target=writer)
    t.start()
    for _ in range(calls):
        r = read_frame()
        if not r.get("ok"):
            raise SystemExit(f"call failed: {r}")
    elapsed = time.perf_counter() - start
    t.join()
    p.stdin.close()
    p.wait()
    return calls / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--core", default=".build/release/wisp-core")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"{'threads':>8} {'requests/s (median of %d)' % a.repeat:>28}")
    for threads in (1, 32):
        rates = sorted(run(a.core, a.calls, threads) for _ in range(a.repeat))
        print(f"{threads:>8} {rates[len(rates) // 2]:>28,.0f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
