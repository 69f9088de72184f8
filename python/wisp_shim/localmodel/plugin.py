"""The local model as the shim's one model companion (core.process.ModelCompanion): what this run
does about it (local_model.plan's decision), started before the core and stopped after it, the
errors it can explain that the core cannot (the server killed by a signal, the model not
installed), and what `--check` says of it. `__main__` knows only `attach`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from .. import config, errors
from ..core.probe import probe_status
from ..core.process import CoreLaunch
from ..errors import ShimError
from . import llama_install, llama_server, local_model

log = logging.getLogger("wisp")

def apple_alternatives() -> str:
    return (f"Without Apple's model, wisp can use its own local model: {llama_install.install_hint()} (then "
            "`--backend auto` starts it whenever Apple's model is unavailable), or point --endpoint at an "
            "OpenAI-compatible server.")


# The decisions under which the server may run beside the core (started, and stopped after it).
RUNS = (local_model.LOCAL, local_model.PROBE_APPLE)


def attach(ns: argparse.Namespace, launch: CoreLaunch, platform: str = sys.platform) -> LocalModelUse | None:
    """The local model's part in this run, as `launch`'s companion; None when the core is left to
    its own backend and the local model has nothing to say."""
    use = LocalModelUse(ns, launch, platform)
    if use.plan.decision == local_model.LEAVE_TO_CORE:
        return None
    launch.companion = use
    return use


class LocalModelUse:
    """What this run does about wisp's own local model (local_model.decide)."""

    def __init__(self, ns: argparse.Namespace, launch: CoreLaunch, platform: str = sys.platform) -> None:
        self.launch = launch
        # --endpoint may be given more than once; the plan asks only whether one was, as WISP_ENDPOINT says it.
        endpoints = ",".join(ns.endpoint) if ns.endpoint else None
        self.plan = local_model.plan(ns.backend, endpoints, llama_server=ns.llama_server,
                                     model_path=ns.model_path, context_size=ns.context_size,
                                     max_threads=config.max_threads(ns), platform=platform)
        self.lm = self.plan.lm
        self.active = False  # the core runs against self.lm
        self._probed = False
        if self.plan.decision == local_model.NOT_INSTALLED:
            log.warning("%s", self.plan.missing)  # the core then explains that no backend is available
        if self.plan.decision == local_model.LOCAL:
            self._activate()

    def _activate(self) -> None:
        assert self.lm is not None
        self.active = True
        self.launch.args += self.lm.core_args()
        self.launch.env = {**(self.launch.env or {}), **self.lm.core_env()}

    async def before_start(self) -> None:
        if self.plan.decision == local_model.PROBE_APPLE and not self._probed:
            # Asked once, of a core of its own: only the core can see FoundationModels.
            apple, _ = await probe_status(self.launch.with_backend("apple"))
            self._probed = True
            if apple.available:
                log.info("Apple's on-device model is available; the local model is not started")
            else:
                log.info("Apple's model is not available (%s); using the local model", apple.reason)
                self._activate()
        if not self.active:
            return
        assert self.lm is not None
        try:
            await self.lm.ensure_running()
        except local_model.LocalModelError as exc:
            raise ShimError(errors.MODEL_UNAVAILABLE, str(exc)) from None

    def after_stop(self) -> None:
        if self.plan.decision in RUNS and self.lm is not None:
            self.lm.stop()

    async def explain(self, error: ShimError, since: float) -> ShimError:
        if error.code not in errors.MODEL_CODES:
            return error
        if self.active and self.lm is not None:
            died = await self.lm.died_since(since)
            if died:
                return ShimError(error.code, f"{died}. wisp restarts it; wisp-core saw: {error.message}")
            return error
        if self.plan.decision == local_model.NOT_INSTALLED:
            other = "" if "--endpoint" in error.message else "; or point --endpoint at an OpenAI-compatible server"
            return ShimError(error.code, f"{error.message.rstrip('.')}. {self.plan.missing}{other}")
        if self.plan.decision in (local_model.APPLE_ONLY, local_model.PROBE_APPLE):
            return ShimError(error.code, f"{error.message} {apple_alternatives()}")
        return error

    async def check(self) -> str | None:
        # /health and the core's status never make the server compute: one short decode does.
        if not self.active or self.lm is None:
            return None
        lm = self.lm
        decoded = await llama_server.decode(lm, timeout=60)
        return decoded or await asyncio.to_thread(llama_server.refuses_unkeyed, lm)

    def describe(self, available: bool) -> list[str]:
        lines = [f"local model:  {self._state()}"]
        if self.plan.facts is not None and self.lm is not None:
            lines.append(f"model file:   {self.plan.facts.describe(self.lm.context_size)}")
        if self.active and available:
            lines.append("model key:    required (a request without it was refused)")
        return lines

    def _state(self) -> str:
        if self.active and self.lm is not None:
            return f"in use: {self.lm.program} serving {self.lm.model}"
        if self.plan.missing:
            return self.plan.missing
        return "installed, not in use (Apple's model is available)"
