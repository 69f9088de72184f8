"""atheris (libFuzzer) target for the shim's side of the pipe: python/wisp_shim/core/protocol.py.

Any bytes from the core, cut into any pieces, must give whole payloads and messages (an ok
reply's result decoded with it, in one pass), or a ProtocolError: never another exception, a hang, or a different result for a different
cut. Run by `make fuzz` (1,000,000 inputs, seeded from fuzz/corpus-python, which
fuzz/record_corpus.py records from real traffic):

    .venv/bin/python fuzz/fuzz_frames.py -runs=1000000 -timeout=10 fuzz/corpus-python
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    import msgspec  # noqa: F401  (compiled: not instrumented, but its errors must stay inside ProtocolError)
    from wisp_shim.core import protocol

def decode_all(pieces: list[bytes]) -> list[object]:
    """What the shim's reader does with a stream: frames, then messages."""
    decoder = protocol.FrameDecoder(max_bytes=1 << 20)
    out: list[object] = []
    try:
        for piece in pieces:
            for payload in decoder.feed(piece):
                out.append(("payload", payload))
                out.append(protocol.decode_message(payload))
        decoder.finish()
        out.append("end")
    except protocol.ProtocolError as exc:
        out.append(("error", str(exc)[:40]))
    return out


def test_one_input(data: bytes) -> None:
    if not data:
        return
    # The first byte picks two cuts, so one input is also a test of split handling.
    body = data[1:]
    a = (data[0] * 7) % (len(body) + 1)
    b = (data[0] * 31) % (len(body) + 1)
    a, b = min(a, b), max(a, b)
    whole = decode_all([body])
    cut = decode_all([body[:a], body[a:b], body[b:]])
    bytewise = decode_all([body[i:i + 1] for i in range(len(body))]) if len(body) <= 64 else whole
    for other in (cut, bytewise):
        if not same_up_to_chunking(whole, other):
            raise AssertionError(f"split changes the result: {whole!r} vs {other!r}")


def same_up_to_chunking(a: list[object], b: list[object]) -> bool:
    """A clean stream decodes the same however it is cut. A broken one fails however it is
    cut, but how far it gets first depends on the cut: `feed` raises for a bad frame before
    it returns the good ones that came earlier in the same chunk (the stream is dead then,
    and the core is restarted anyway)."""
    a_err = isinstance(a[-1], tuple) and a[-1][0] == "error"
    b_err = isinstance(b[-1], tuple) and b[-1][0] == "error"
    if a_err != b_err:
        return False
    if not a_err:
        return a == b
    a_ok, b_ok = a[:-1], b[:-1]
    n = min(len(a_ok), len(b_ok))
    return a_ok[:n] == b_ok[:n]


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
