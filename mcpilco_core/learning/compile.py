"""Optional ``torch.compile`` of the rollout kernels, with a safe fallback to eager code.

Its own module so that the rollout kernels (:mod:`.fused`) and the policy's torch twin (:mod:`.torch_policy`) can
both use it without importing each other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

LOG = logging.getLogger("mcpilco.compile")
COMPILE_OPTIONS: dict = {}


class MaybeCompiled:
    """``fn``, through ``torch.compile`` when ``compiled``; on any compilation or run failure of the compiled
    version it warns once and uses ``fn`` from then on (the functions are pure, so rerunning is safe)."""

    def __init__(self, fn: Callable, compiled: bool) -> None:
        self.fn = fn
        self.compiled = None
        self.active = compiled

    def __call__(self, *args):
        if self.active:
            try:
                if self.compiled is None:
                    self.compiled = torch.compile(self.fn, fullgraph=True, dynamic=False, options=COMPILE_OPTIONS)
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001 - any compiler failure falls back to eager
                self.active = False
                LOG.warning("torch.compile of %s failed (%s: %s); using the eager version", self.fn.__name__,
                            type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return self.fn(*args)
