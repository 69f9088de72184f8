"""llama.cpp's server from the `xllamacpp` wheel, as a process of its own with llama-server's
command line (the part wisp uses), so that the shim starts, watches and stops either server
the same way (llama_server.LocalModel).

    python -m wisp_shim.localmodel.xllamacpp_server [--import-path DIR] -m MODEL.gguf --port N [-c N] [-np N] [-t N] [-tb N] ...

The wheel compiles llama.cpp's `tools/server` into a Python extension: `xllamacpp.Server(params)`
listens in threads of its own, so this process only fills the parameters, starts it and waits
for a stop signal. The API key comes from LLAMA_API_KEY, as llama-server's does, so that it
never shows in a process listing.

It imports nothing of wisp's but this file (the package's __init__ is a docstring), and the
wheel's 100 MB library is loaded here, never in the shim.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

# The exit status when the wheel cannot be loaded (not installed, or libgomp.so.1 missing):
# llama_server.describe_exit turns it into what to install.
CANNOT_LOAD = 78
API_KEY_ENV = "LLAMA_API_KEY"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m wisp_shim.localmodel.xllamacpp_server", description=__doc__.split("\n\n")[0])
    # Where the shim found xllamacpp: a venv's site-packages, or the data dir of
    # `--install-local-model`, which is on no Python's path.
    ap.add_argument("--import-path")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--alias")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("-c", "--ctx-size", type=int, default=0)
    ap.add_argument("-np", "--parallel", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=-1)
    ap.add_argument("-tb", "--threads-batch", type=int, default=-1)
    ap.add_argument("--no-kv-unified", action="store_true")
    ap.add_argument("--cont-batching", action="store_true")
    ap.add_argument("--no-ui", action="store_true")
    ap.add_argument("-n", "--n-predict", type=int, default=-1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse(sys.argv[1:] if argv is None else argv)
    if ns.import_path:
        sys.path.insert(0, ns.import_path)
    try:
        import xllamacpp
    except ImportError as exc:  # an OSError from dlopen reaches Python as an ImportError
        print(f"wisp: cannot load xllamacpp: {exc}", file=sys.stderr, flush=True)
        return CANNOT_LOAD
    p = xllamacpp.CommonParams()
    p.model.path = ns.model
    if ns.alias:
        p.model_alias = {ns.alias}
    p.hostnames = [ns.host]
    p.port = ns.port
    p.n_ctx = ns.ctx_size
    p.n_parallel = ns.parallel
    p.kv_unified = not ns.no_kv_unified
    p.cont_batching = True if ns.cont_batching else p.cont_batching
    p.cpuparams.n_threads = ns.threads
    p.cpuparams_batch.n_threads = ns.threads_batch if ns.threads_batch > 0 else ns.threads
    p.ui = not ns.no_ui
    p.n_predict = ns.n_predict
    p.use_jinja = True  # llama-server's default: the chat template from the GGUF, tools included
    key = os.environ.get(API_KEY_ENV, "")
    if key:
        p.api_keys = [k for k in key.split(",") if k]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # its threads inherit the mask
    server = xllamacpp.Server(p)  # loads the model and listens; raises if it cannot
    # stderr: this process's stdout is not the MCP stream, but wisp keeps stdout for protocol bytes everywhere.
    sys.stderr.write(f"xllamacpp {getattr(xllamacpp, '__version__', '?')} listening at {server.listening_address}\n")
    sys.stderr.flush()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    # The server's threads hold the model: leaving without their teardown is the quick, clean stop.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
