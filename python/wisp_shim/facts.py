"""The core's facts, as the core states them: the shim knows them before any core runs (to
parse its flags, describe its tools, check arguments and frames) and declares none of them.

`wisp-core --facts` prints them from the declarations the core works by; `make facts` copies
that into core_facts.json beside this file, and tests/python/test_agreement.py checks the copy
against the built core, so a change on the Swift side that is not copied here fails a test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

FACTS = json.loads(Path(__file__).with_name("core_facts.json").read_text(encoding="utf-8"))

# The pipe: its version (what `Ready.protocol` must say) and the largest frame either side reads.
PROTOCOL_VERSION: int = FACTS["protocol"]
MAX_FRAME_BYTES: int = FACTS["max_frame_bytes"]
# The op of every request the core's pipe reads, in its order: core/protocol.py's OPERATIONS
# declares one request for each (tests/python/test_agreement.py holds the two to each other).
OPERATIONS: tuple[str, ...] = tuple(FACTS["operations"])
# The most a call's `max_output_tokens` may ask for (a token count the core holds).
MAX_OUTPUT_TOKENS: int = FACTS["max_output_tokens"]
# Every code a core error reply may carry.
CORE_CODES: frozenset[str] = frozenset(FACTS["error_codes"])
# `--backend`'s words, and each integer flag's least and largest value (and default, where it has one).
BACKENDS: tuple[str, ...] = tuple(FACTS["backends"])
FLAG_MINIMUMS: dict[str, int] = {flag: f["minimum"] for flag, f in FACTS["flags"].items()}
FLAG_MAXIMUMS: dict[str, int] = {flag: f["maximum"] for flag, f in FACTS["flags"].items()}
FLAG_DEFAULTS: dict[str, int] = {flag: f["default"] for flag, f in FACTS["flags"].items() if "default" in f}
DEFAULT_MAX_THREADS: int = FLAG_DEFAULTS["--max-threads"]
# The thread-id rule: the pattern, and the sentence that states it.
THREAD_ID_CHARS = f"[{FACTS['thread_id']['bytes']}]{{1,{FACTS['thread_id']['max_length']}}}"
THREAD_ID_RE = re.compile(THREAD_ID_CHARS)
THREAD_ID_RULE: str = FACTS["thread_id"]["rule"]
# The most roots one call may offer the core.
MAX_CLIENT_ROOTS: int = FACTS["client_roots"]["max"]
# The longest list_threads query, in bytes of UTF-8: the core alone refuses a longer one.
MAX_QUERY_BYTES: int = FACTS["query"]["max_bytes"]
# `reasoning`'s levels, lightest first.
REASONING_LEVELS: tuple[str, ...] = tuple(FACTS["reasoning_levels"])
# The model tools a thread may be given, by name, with what each does.
MODEL_TOOLS: dict[str, str] = {t["name"]: t["description"] for t in FACTS["model_tools"]}
# A progress frame's preview (the last code points of the answer so far) and the least interval
# between two frames of one call: the core keeps to both, and the shim's notifications follow them.
PROGRESS_PREVIEW_CODE_POINTS: int = FACTS["progress"]["preview_code_points"]
PROGRESS_INTERVAL_S: float = FACTS["progress"]["interval_ms"] / 1000
