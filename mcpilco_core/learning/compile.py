"""Optional ``torch.compile`` of the rollout kernels, with a safe fallback to eager code.

Its own module so that the rollout kernels (:mod:`.fused`) and the policy's torch twin (:mod:`.torch_policy`) can
both use it without importing each other.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

import torch

LOG = logging.getLogger("mcpilco.compile")
COMPILE_OPTIONS: dict = {}
_INSTANCES: weakref.WeakSet = weakref.WeakSet()


def fresh_compilation() -> None:
    """Forget every compiled kernel, as a new process would start.

    Why: torch.compile (``dynamic=False``) compiles once per input shape, and after ``recompile_limit`` (8) shapes of
    one function it fails, which sends that kernel to its eager version for the rest of the process. A long offline
    run meets more shapes than one trial does (the GP's points grow trial by trial), so from about the fourth trial
    on it ran eager code where a session's retrain (a fresh process per trial) ran compiled code: the float rounding
    differs, and the two runs parted. The learner calls this before each trial's optimisation."""
    torch._dynamo.reset()
    for instance in list(_INSTANCES):
        instance.compiled = None
        instance.active = instance.requested


class MaybeCompiled:
    """``fn``, through ``torch.compile`` when ``compiled``; on any compilation or run failure of the compiled
    version it warns once and uses ``fn`` from then on, until :func:`fresh_compilation` (the functions are pure, so
    rerunning is safe)."""

    def __init__(self, fn: Callable, compiled: bool) -> None:
        self.fn = fn
        self.compiled = None
        self.requested = compiled
        self.active = compiled
        _INSTANCES.add(self)

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
