"""Disturbance windows on the real robot: the evaluation protocol's reset PID, run by the driver itself.

``~/disturb`` arms one window (:meth:`DisturbanceWindows.request`, from the ROS thread); the driver loop asks
:meth:`DisturbanceWindows.step` every cycle. From the next cycle on, for the protocol's window length (0.2 s:
100 cycles at 500 Hz), both motors get ``mcpilco_core.evaluation.DisturbanceWindow``'s torque (PID Kp 10, Ki 0.1,
Kd 1 with its 1 ms dt and a fresh error history, plus gravity compensation from ``disturbance.plant_model``)
towards a random target (``DisturbanceTargets(disturbance.seed)``: window n uses the n-th draw), computed from the
measured joint state and clipped to ``disturbance.torque_limit`` on both joints, and on the actuated joint also to its
own ``torque_limit`` (a bring-up limit below the window's holds in the window too).

The safety supervisor still decides first, every cycle: a latched stop or fault (``~/stop``, a controller fault,
a CAN timeout, a NaN reading) stops both motors and ends the window; a velocity or position limit ends the
window and the supervisor's damping follows. When a window ends, however it ends, the passive joint's motor is
sent a stop (zero torque, unpowered) until a CAN transaction carrying it succeeds (:attr:`release_pending`);
outside a window the passive motor only ever receives queries or stops, so it gets exactly 0.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import load_plant_parameters
from ..evaluation import DisturbanceTargets, DisturbanceWindow
from ..plant import DoublePendulum
from .config import DriverConfig, plant_models_file
from .safety import SafetyDecision, SafetyState


@dataclass(frozen=True)
class DisturbanceStep:
    """One cycle inside a window: window ``index``, ``target`` (rad), ``step`` (0-based cycle of the window) and
    the joint ``torques`` (N m, both joints, already clipped to the disturbance torque limit)."""

    index: int
    target: tuple[float, float]
    step: int
    torques: tuple[float, float]


class DisturbanceWindows:
    """Arms and runs disturbance windows for :class:`~mcpilco_core.hardware.driver.MoteusDriver` (module docstring).

    Thread-safe: :meth:`request` from the ROS thread, :meth:`step` and :meth:`released` from the CAN loop.
    ``plant`` (default: ``disturbance.plant_model`` of the package's plant models) gives the gravity compensation.
    """

    def __init__(self, config: DriverConfig, plant: DoublePendulum | None = None) -> None:
        settings = config.disturbance
        self.limit = float(settings.torque_limit)
        act = config.actuated_joint
        # N m per joint in a window: the window's limit, and never above the actuated joint's own limit
        self.limits = tuple(min(self.limit, joint.torque_limit) if i == act else self.limit
                            for i, joint in enumerate(config.joints))
        self.dt = config.period
        self.plant = plant or DoublePendulum(load_plant_parameters(plant_models_file(), settings.plant_model))
        self.targets = DisturbanceTargets(settings.seed)
        self._lock = threading.Lock()
        self._window: DisturbanceWindow | None = None
        self._cycle = 0
        self.armed = False              # a window is requested or running
        self.release_pending = False    # the passive motor must be sent a stop (a window ended)
        self.windows: list[dict] = []   # every window: index, target, seed, torque_limit, cycles, outcome

    # ------------------------------------------------------------------ the ROS side
    def request(self, latched_reason: str = "") -> tuple[bool, str]:
        """Arm a window for the next cycle; (accepted, JSON of the window or why not). ``latched_reason``: the
        supervisor's latched stop, if any (a window is refused then)."""
        with self._lock:
            if self.limit <= 0.0:
                return False, "refused: disturbance.torque_limit is 0"
            if latched_reason:
                return False, f"refused: the driver is stopped ({latched_reason})"
            if self.armed:
                return False, f"refused: disturbance window {self.windows[-1]['index']} is still running"
            target = self.targets.next()
            self._window = DisturbanceWindow(target, self.plant, self.dt)
            self._cycle = 0
            self.armed = True
            info = {"index": len(self.windows), "target": [float(v) for v in target], "seed": self.targets.seed,
                    "torque_limit": self.limit}
            self.windows.append({**info, "cycles": 0, "outcome": "armed"})
            return True, _answer(info)

    # ------------------------------------------------------------------ the loop's side
    def step(self, decision: SafetyDecision, q: Sequence[float], dq: Sequence[float]) -> DisturbanceStep | None:
        """This cycle's window torques from the measured state (rad, rad/s), or None outside a window. A stop or
        damping decision ends the window (the supervisor's decision stands)."""
        with self._lock:
            if not self.armed or self._window is None:
                return None
            record = self.windows[-1]
            if decision.stop or decision.state is SafetyState.DAMPING:
                return self._end(f"aborted: {decision.state.value} ({decision.reason})")
            x = (float(q[0]), float(q[1]), float(dq[0]), float(dq[1]))
            u = self._window(self._cycle, self._cycle * self.dt, x)
            if u is None:
                return self._end("completed")
            if not all(math.isfinite(float(v)) for v in u):
                return self._end("aborted: non-finite window torque")
            torques = (_clip(float(u[0]), self.limits[0]), _clip(float(u[1]), self.limits[1]))
            step = DisturbanceStep(record["index"], (record["target"][0], record["target"][1]), self._cycle, torques)
            self._cycle += 1
            record["cycles"] = self._cycle
            record["outcome"] = "running"
            return step

    def _end(self, outcome: str) -> None:
        """End the running window (outcome recorded); the passive motor is stopped next."""
        self.windows[-1]["outcome"] = outcome
        self.armed = False
        self._window = None
        self.release_pending = True
        return None

    def released(self) -> None:
        """The stop for the passive motor went out in a successful CAN transaction."""
        self.release_pending = False

    def summary(self) -> dict:
        """For diagnostics: active, windows started, the last window's target, cycles and outcome, seed, limit, and
        its ~/disturb answer (``disturbance_last``: what the trainer reads when that answer was lost)."""
        last = self.windows[-1] if self.windows else {}
        return {"disturbance_active": self.armed, "disturbance_windows": len(self.windows),
                "disturbance_target": [round(float(v), 6) for v in last.get("target", [])],
                "disturbance_cycles": last.get("cycles", 0), "disturbance_outcome": last.get("outcome", ""),
                "disturbance_seed": self.targets.seed, "disturbance_torque_limit": self.limit,
                "disturbance_last": _answer(last) if last else ""}


ANSWER_KEYS = ("index", "target", "seed", "torque_limit")


def _answer(window: dict) -> str:
    """The ~/disturb answer of a window: JSON of its index, target, seed and torque limit."""
    return json.dumps({key: window[key] for key in ANSWER_KEYS})


def _clip(value: float, limit: float) -> float:
    return min(max(value, -limit), limit)
