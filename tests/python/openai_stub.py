"""Test helpers for the openai backend: a scripted OpenAI-compatible server, and a recording
proxy in front of a real one. Both run in a thread of the test process, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def closed_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    # RecordingProxy, chat requests: the `timings` and the `usage` llama-server streamed (None:
    # none); other requests: the JSON it answered (None: not JSON). Set once answered.
    timings: dict | None = None
    usage: dict | None = None
    text: str | None = None  # RecordingProxy, chat requests: the content the server streamed
    answer: Any = None
    answered: threading.Event = field(default_factory=threading.Event)


@dataclass
class StubConfig:
    model: str = "stub-model"
    n_ctx: int | None = 4096          # /props answers with this; None: /props is 404
    slots: int | None = None          # /props says total_slots (as llama.cpp's server does); None: it does not
    tokenize: bool = True             # /tokenize counts words
    chunk_delay_s: float = 0.0        # between streamed chunks
    words: int = 0                    # extra filler words streamed after the reply
    overflow_chars: int | None = None # total message chars above this → overflow error
    overflow_style: str = "llama.cpp" # llama.cpp | llama-cpp-python | openai | vllm
    status: int = 200                 # non-200: every chat request fails with this
    models_status: int = 200          # non-200: GET /v1/models answers with this (503: still loading)
    tool_call: dict | None = None     # first round answers with this tool call
    ignore_stream: bool = False       # answer with one JSON body even when asked to stream
    reply: str | None = None          # stream this text (4 characters a token) instead of "reply N: …";
                                      # past the request's max_tokens it stops with finish_reason "length"
    usage: bool = True                # end each stream (tool rounds too) with a `usage` event
    reasoning: str | None = None      # stream this as `reasoning_content` deltas before the reply
    reject_reasoning: bool = False    # a request with reasoning_effort → HTTP 400 naming it (OpenAI's words)
    input_tokens: bool = False        # POST /v1/chat/completions/input_tokens answers (chars // 4, as usage says)
    # Which server the stub plays beyond the chat route (the facts are in OpenAIDialects.swift):
    # llama.cpp (/props), ollama (/api/ps, /api/show, /api/generate; /props is 404), lmstudio
    # (/api/v0/models; unknown paths answer 200 with an error), vllm (max_model_len in /v1/models).
    dialect: str = "llama.cpp"
    window: int | None = None         # ollama, lmstudio, vllm: the loaded model's window in tokens (chars // 4)
    loaded: bool = True               # ollama, lmstudio: the model is loaded (listed with its window)
    shown_num_ctx: int | None = None  # ollama: `num_ctx` in /api/show's parameters
    fit_silently: bool = False        # fit a longer conversation to `window` as Ollama does: oldest
                                      # messages dropped (system and last kept), then the last cut by tokens
    template_tokens: int = 0          # the chat template's fixed tokens, counted in every prompt (not in chars)
    cache: bool = False               # report the tokens of the previous request's message prefix as cached
    first_byte_delay_s: float = 0.0   # before the stream's first byte (a prompt being read)
    replies: list[str] | None = None  # the Nth chat request streams the Nth of these (a real model's, replayed)
    on_chat: Any = None               # called with each chat request's index (from 0) before it is answered
    # A number the stub reports, put in as this JSON text (any text: "1e300", "9223372036854775807"),
    # by where: props.n_ctx, props.total_slots, models.max_model_len, tokenize.count (answers
    # {"count": …}), input_tokens (the endpoint answers it), usage.prompt_tokens,
    # usage.completion_tokens, usage.reasoning_tokens.
    numbers: dict[str, str] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stub: "OpenAIStub"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, obj: Any) -> None:
        data = _encode(obj)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: Any) -> None:
        self.stub.requests.append(Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))

    def do_GET(self) -> None:
        self._record(None)
        cfg = self.stub.config
        loaded = cfg.loaded and cfg.window is not None
        if self.path == "/v1/models" and cfg.models_status != 200:
            self._json(cfg.models_status, {"error": {"code": cfg.models_status, "message": "Loading model"}})
        elif self.path == "/v1/models":
            entry: dict[str, Any] = {"id": cfg.model, "object": "model"}
            if cfg.dialect == "vllm" and cfg.window is not None:
                entry["max_model_len"] = cfg.window
            if "models.max_model_len" in cfg.numbers:
                entry["max_model_len"] = _Number(cfg.numbers["models.max_model_len"])
            self._json(200, {"object": "list", "data": [entry]})
        elif cfg.dialect == "ollama" and self.path == "/api/ps":
            running = [{"name": cfg.model, "model": cfg.model, "context_length": cfg.window}] if loaded else []
            self._json(200, {"models": running})
        elif cfg.dialect == "lmstudio" and self.path == "/api/v0/models":
            entry = {"id": cfg.model, "object": "model", "type": "llm", "state": "loaded" if loaded else "not-loaded",
                     "max_context_length": 131072}
            if loaded:
                entry["loaded_context_length"] = cfg.window
            self._json(200, {"object": "list", "data": [entry]})
        elif cfg.dialect == "lmstudio":
            self._json(200, {"error": f"Unexpected endpoint or method. (GET {self.path})"})
        elif self.path == "/props" and cfg.n_ctx is not None and cfg.dialect == "llama.cpp":
            n_ctx = _Number(cfg.numbers["props.n_ctx"]) if "props.n_ctx" in cfg.numbers else cfg.n_ctx
            props: dict[str, Any] = {"default_generation_settings": {"n_ctx": n_ctx}}
            if cfg.slots is not None:
                props["total_slots"] = cfg.slots
            if "props.total_slots" in cfg.numbers:
                props["total_slots"] = _Number(cfg.numbers["props.total_slots"])
            self._json(200, props)
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"null")
        self._record(body)
        cfg = self.stub.config
        if cfg.dialect == "ollama" and self.path == "/api/show":
            parameters = f"num_ctx {cfg.shown_num_ctx}\nstop <|im_end|>" if cfg.shown_num_ctx else "stop <|im_end|>"
            self._json(200, {"parameters": parameters, "model_info": {"general.context_length": 131072}})
        elif cfg.dialect == "ollama" and self.path == "/api/generate":
            self._json(200, {"model": body.get("model"), "response": "", "done": True, "done_reason": "load"})
        elif cfg.dialect == "lmstudio" and self.path != "/v1/chat/completions":
            self._json(200, {"error": f"Unexpected endpoint or method. (POST {self.path})"})
        elif self.path == "/tokenize" and "tokenize.count" in cfg.numbers:
            self._json(200, {"count": _Number(cfg.numbers["tokenize.count"])})
        elif self.path == "/tokenize" and cfg.tokenize and cfg.dialect == "llama.cpp":
            self._json(200, {"tokens": list(range(len(body["content"].split())))})
        elif self.path == "/v1/chat/completions/input_tokens" and "input_tokens" in cfg.numbers:
            self._json(200, {"input_tokens": _Number(cfg.numbers["input_tokens"]), "object": "response.input_tokens"})
        elif self.path == "/v1/chat/completions/input_tokens" and cfg.input_tokens:
            self._json(200, {"input_tokens": _chars(body) // 4, "object": "response.input_tokens"})
        elif self.path == "/v1/chat/completions":
            self._chat(body)
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def _chat(self, body: dict) -> None:
        cfg = self.stub.config
        if cfg.status != 200:
            self._json(cfg.status, {"error": {"code": cfg.status, "message": "the stub is broken on purpose", "type": "server_error"}})
            return
        if cfg.reject_reasoning and "reasoning_effort" in body:
            self._json(400, {"error": {"message": "Unrecognized request argument supplied: reasoning_effort",
                                       "type": "invalid_request_error", "param": None, "code": None}})
            return
        if cfg.fit_silently and cfg.window is not None:
            body = {**body, "messages": _fit(body["messages"], cfg.window - cfg.template_tokens)}
        chars = _chars(body) + 4 * cfg.template_tokens
        if cfg.overflow_chars is not None and chars > cfg.overflow_chars:
            self._json(400, _overflow(cfg.overflow_style, chars))
            return
        cached = None
        if cfg.cache:
            previous, self.stub.previous = self.stub.previous, body["messages"]
            same = 0
            while same < min(len(previous), len(body["messages"])) and previous[same] == body["messages"][same]:
                same += 1
            cached = _chars({"messages": body["messages"][:same]}) // 4
        if cfg.first_byte_delay_s:
            time.sleep(cfg.first_byte_delay_s)  # kept: a slow server is this fake's behaviour
        users = [m for m in body["messages"] if m["role"] == "user"]
        if cfg.on_chat is not None:
            cfg.on_chat(len(self.stub.chats()) - 1)
        if cfg.ignore_stream:
            text = f"reply {len(users)}: {body['messages'][-1]['content']}"
            self._json(200, {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                             "usage": {"prompt_tokens": chars // 4, "completion_tokens": 3}})
            self.stub.completed += 1
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        last = body["messages"][-1]
        if cfg.tool_call is not None and last["role"] == "user" and body.get("tools") and body.get("tool_choice") != "none":
            delta = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": cfg.tool_call["name"], "arguments": json.dumps(cfg.tool_call["arguments"])}}]}
            self._event({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
            if cfg.usage:
                self._event({"choices": [], "usage": {"prompt_tokens": chars // 4, "completion_tokens": 1, "total_tokens": 0}})
        else:
            prompt = last["content"] if last["role"] == "user" else f"tool said {last['content']}"
            pieces = [f"reply {len(users)}:", *[" " + w for w in prompt.split(" ")]] + [" filler"] * cfg.words
            finish = "stop"
            scripted = cfg.reply
            if cfg.replies is not None:
                scripted = cfg.replies[min(self.stub.scripted, len(cfg.replies) - 1)]
                self.stub.scripted += 1
            if scripted is not None:
                pieces = [scripted[i : i + 4] for i in range(0, len(scripted), 4)]
                if body.get("max_tokens") is not None and len(pieces) > body["max_tokens"]:
                    pieces, finish = pieces[: body["max_tokens"]], "length"
            try:
                for k in range(0, len(cfg.reasoning or ""), 4):
                    self._event({"choices": [{"index": 0, "delta": {"reasoning_content": cfg.reasoning[k : k + 4]}, "finish_reason": None}]})
                for piece in pieces:
                    self._event({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                    if cfg.chunk_delay_s:
                        time.sleep(cfg.chunk_delay_s)  # kept: a slow stream is this fake's behaviour
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):  # SSLError: the same over https
                self.stub.disconnects += 1
                return
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            if cfg.usage:
                thought = -(-len(cfg.reasoning or "") // 4)
                usage: dict[str, Any] = {"prompt_tokens": chars // 4, "completion_tokens": thought + len(pieces), "total_tokens": 0}
                if cfg.reasoning is not None:  # as OpenAI reports it; llama-server reports no details
                    usage["completion_tokens_details"] = {"reasoning_tokens": thought}
                if cached:  # as vLLM and Ollama report it: absent when none
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                for key in ("prompt_tokens", "completion_tokens"):
                    if "usage." + key in cfg.numbers:
                        usage[key] = _Number(cfg.numbers["usage." + key])
                if "usage.reasoning_tokens" in cfg.numbers:
                    reasoning_tokens = _Number(cfg.numbers["usage.reasoning_tokens"])
                    usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
                self._event({"choices": [], "usage": usage})
        self._raw(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.stub.completed += 1

    def _event(self, obj: Any) -> None:
        self._raw(b"data: " + _encode(obj) + b"\n\n")

    def _raw(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class _Number(str):
    """A number written as this JSON text, whatever Python would make of it (1e400, 2**64)."""


def _encode(obj: Any) -> bytes:
    numbers: list[str] = []

    def mark(o: Any) -> Any:
        if isinstance(o, _Number):
            numbers.append(str(o))
            return f"\x00{len(numbers) - 1}\x00"
        if isinstance(o, dict):
            return {k: mark(v) for k, v in o.items()}
        if isinstance(o, list):
            return [mark(v) for v in o]
        return o

    text = json.dumps(mark(obj))
    for i, number in enumerate(numbers):
        text = text.replace(f'"\\u0000{i}\\u0000"', number)
    return text.encode()


def _chars(body: dict) -> int:
    """What the stub counts a request's prompt by: its messages' characters (4 to a token)."""
    return sum(len(m.get("content") or "") for m in body["messages"])


def _fit(messages: list[dict], window: int) -> list[dict]:
    """Ollama's fitting of a conversation to its window (server/prompt.go chatPrompt): the oldest
    messages go first, the system messages and the last message stay; a last message still too
    long is cut to its first 16 characters (num_keep) and its tail."""
    kept = list(messages)
    while _chars({"messages": kept}) // 4 > window:
        drop = next((i for i, m in enumerate(kept[:-1]) if m["role"] != "system"), None)
        if drop is None:
            last = dict(kept[-1])
            room = max(0, window * 4 - _chars({"messages": kept[:-1]}) - 16)
            last["content"] = last["content"][:16] + last["content"][len(last["content"]) - room:] if room else last["content"][:16]
            return kept[:-1] + [last]
        del kept[drop]
    return kept


def _overflow(style: str, tokens: int) -> dict:
    if style == "llama.cpp":
        return {"error": {"code": 400, "message": f"request ({tokens} tokens) exceeds the available context size (100 tokens), try increasing it",
                          "type": "exceed_context_size_error", "n_prompt_tokens": tokens, "n_ctx": 100}}
    if style == "llama-cpp-python":
        return {"error": {"message": f"This model's maximum context length is 100 tokens. However, you requested {tokens} tokens.",
                          "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
    if style == "openai":
        return {"error": {"message": "This model's maximum context length is 100 tokens.", "type": "invalid_request_error",
                          "param": "messages", "code": "context_length_exceeded"}}
    if style == "lmstudio":
        return {"error": "Trying to keep the first 150 tokens when context the overflows. However, the model is loaded "
                         "with context length of only 100 tokens, which is not enough. Try to load the model with a "
                         "larger context length, or provide a shorter input"}
    # vLLM
    return {"object": "error", "message": f"This model's maximum context length is 100 tokens. However, your request has {tokens} input tokens.",
            "type": "BadRequestError", "param": None, "code": 400}


class OpenAIStub:
    """`with OpenAIStub(cfg) as stub:` serves on stub.endpoint (…/v1); stub.requests records every request.
    `port`: that one (an endpoint that was down coming up), else a free one."""

    def __init__(self, config: StubConfig | None = None, port: int = 0) -> None:
        self.config = config or StubConfig()
        self.requests: list[Recorded] = []
        self.disconnects = 0
        self.completed = 0
        self.previous: list[dict] = []  # the last chat's messages (config.cache)
        self.scripted = 0  # config.replies handed out
        handler = type("Handler", (_Handler,), {"stub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/v1"

    def chats(self) -> list[dict]:
        return [r.body for r in self.requests if r.path == "/v1/chat/completions"]

    def __enter__(self) -> "OpenAIStub":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def _last_timings(stream: bytes, key: str = "timings") -> dict | None:
    """The last `timings` (or `key`) object in an SSE stream (or a plain JSON answer)."""
    found = None
    for line in stream.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if not line.startswith(b"{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get(key), dict):
            found = event[key]
    return found


def _content(stream: bytes) -> str:
    """The `content` deltas of a streamed chat completion, joined."""
    out = []
    for line in stream.split(b"\n"):
        if line.startswith(b"data: {"):
            with contextlib.suppress(ValueError):
                for choice in json.loads(line[6:]).get("choices") or []:
                    out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


class RecordingProxy:
    """Forwards every request to `upstream` (http://127.0.0.1:PORT) unchanged, streaming the answer
    back chunk by chunk, and records the request bodies it forwarded and, per chat request, the
    `timings` llama-server reported in its stream (None when it reported none)."""

    def __init__(self, upstream_port: int, hide: tuple[str, ...] = (), api_key: str | None = None) -> None:
        self.upstream_port = upstream_port
        # Sent upstream for a client that sends none: wisp's own local model server wants its key,
        # which only a core that started it would know.
        self.api_key = api_key
        self.hide = hide  # paths answered 404 here, e.g. ("/tokenize",) to turn off the core's pre-flight count
        self.requests: list[Recorded] = []
        self.statuses: list[tuple[str, int]] = []
        self.disconnects = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(n) if n else b""
                recorded = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                    json.loads(raw) if raw else None)
                proxy.requests.append(recorded)
                if self.path in proxy.hide:
                    data = b'{"error":{"code":404,"message":"hidden by the test proxy","type":"not_found_error"}}'
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    proxy.statuses.append((self.path, 404))
                    recorded.answered.set()
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=600)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                if proxy.api_key and "authorization" not in {k.lower() for k in headers}:
                    headers["Authorization"] = f"Bearer {proxy.api_key}"
                conn.request(self.command, self.path, body=raw or None, headers=headers)
                resp = conn.getresponse()
                proxy.statuses.append((self.path, resp.status))
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection", "keep-alive"):
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chat = self.path.endswith("/chat/completions")
                seen = bytearray()
                try:
                    while True:
                        chunk = resp.read1(65536)
                        if not chunk:
                            break
                        seen += chunk
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    proxy.disconnects += 1
                finally:
                    conn.close()  # closing upstream makes llama-server stop generating
                    if chat:
                        recorded.timings = _last_timings(bytes(seen))
                        recorded.usage = _last_timings(bytes(seen), "usage")
                        recorded.text = _content(bytes(seen))
                    else:
                        try:
                            recorded.answer = json.loads(bytes(seen))
                        except ValueError:
                            pass
                    recorded.answered.set()

            do_GET = do_POST = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/v1"

    def chats(self) -> list[dict]:
        return [r.body for r in self.requests if r.path == "/v1/chat/completions"]

    def answered_chats(self, timeout: float = 10.0) -> list[Recorded]:
        """The chat requests, each once its answer has passed through whole (the core may have
        its reply a moment before the proxy sees the stream end)."""
        chats = [r for r in self.requests if r.path == "/v1/chat/completions"]
        for r in chats:
            r.answered.wait(timeout)
        return chats

    def __enter__(self) -> "RecordingProxy":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
