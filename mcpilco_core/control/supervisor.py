"""The supervisor: one controller composed of swing-up policy, LQR, damping and a safe stop.

Priority, evaluated at every state (500 Hz):

1. ``safe``    - the state (or time) is not finite, or has the wrong shape: zero torque.
2. ``damping`` - max |dq| rose above ``damping.enter_speed`` and has not yet fallen below ``exit_speed``:
                 u = -gain * dq on the actuated joint (removes energy the PID or a bad swing put in).
3. ``lqr``     - V(x) = (x~ - g)^T S (x~ - g) < enter_fraction * rho, kept until V > exit_fraction * rho
                 (with the opt-in ``roa.reenter_below_line``, after such a hand-back only once the end effector
                 has been below the score line again);
                 plus the robot config's opt-in balance ``dither`` (a shake on the actuated joint, phase from
                 the moment the LQR took over) that keeps a passive joint with Coulomb friction sliding, and its
                 opt-in ``catch``: above V = catch.lqr_level * rho a receding-horizon plan (control/catch.py)
                 acts in place of the LQR (the mode stays ``lqr``; ``catching`` says which acts).
4. ``policy``  - the swing-up policy, evaluated at its own period and held in between (zero-order hold); with
                 the robot config's opt-in ``selection``, one of several (the loaded one and a bank), chosen by
                 simulating each on the config's plant (control/selection.py).
5. ``idle``    - no policy loaded: zero torque outside the LQR's region of attraction.

With the robot config's opt-in ``observer`` every mode acts on the filtered state (control/observer.py), not the
measured one.

x~ is the state with multi-turn angles wrapped (q1 around pi, q2 around 0); the policy sees sin/cos only.
The passive joint's torque is exactly 0.0 in every mode, and the actuated one is clipped to its limit -- unless
the robot config turns on the opt-in ``friction_compensation``: then in the policy, LQR and damping modes the
passive joint's own motor cancels that joint's friction (bounded by its limit, <= 0.5 N m), nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ..config import ObserverConfig, RobotConfig, SelectionConfig
from ..plant import DoublePendulum, wrap_angle
from .catch import build_catch
from .lqr import LqrDesign
from .observer import StateObserver
from .selection import PolicySelection
from .selection_workers import SelectionWorkers

MODES = ("policy", "lqr", "damping", "safe", "idle")
POLICY_TICK_TOLERANCE = 1e-9  # s: float slack when comparing times on the policy's grid

Policy = Callable[[np.ndarray], float]


class Supervisor:
    """Controller API used by the evaluator, the ROS nodes and the CLI (see module docstring).

    ``step(x, t)`` takes the measured state (rad, rad/s; angles may be multi-turn) and the time in seconds,
    and returns the torques (N m) for (shoulder, elbow).
    """

    def __init__(self, config: RobotConfig, design: LqrDesign, rho: float, policy: Policy | None = None,
                 bank: Sequence[Policy] = ()) -> None:
        self.config = config
        self.design = design
        self.rho = float(rho)
        self._act = config.actuated_joint
        self._limit = config.torque_limit
        self._k_row = design.K[self._act].copy()
        self._model = DoublePendulum(config.plant)     # the controller's own plant: places the score line
        self._catch = build_catch(self._model, design, config)
        self._observer = (StateObserver(DoublePendulum(config.plant), config.observer, config.control_period)
                          if config.observer.enabled else None)
        self._candidates: list[Policy | None] = [policy, *bank]
        self._selection = None
        if config.selection.enabled:
            # the candidates' simulations see the model's exact states: no selection inside, nothing to filter
            shadow = Supervisor(replace(config, selection=SelectionConfig(), observer=ObserverConfig()), design, rho)
            model = DoublePendulum(config.selection.plant or config.plant)   # what the candidates are simulated on
            self._selection = PolicySelection(shadow, model, config.selection, config.control_period,
                                              config.torque_limits)
        self.reset()

    # ---------------------------------------------------------------- public API
    @property
    def mode(self) -> str:
        """The mode of the last step: policy / lqr / damping / safe / idle."""
        return self._mode

    @property
    def catching(self) -> bool:
        """Whether the last step's torque came from the opt-in catch plan (in mode ``lqr``)."""
        return self._catch is not None and self._mode == "lqr" and self._catch.active

    @property
    def policy(self) -> Policy | None:
        """The loaded swing-up policy (with the opt-in selection: candidate 0, whichever one runs)."""
        return self._candidates[0]

    @property
    def selected(self) -> int:
        """Index of the running candidate: 0 = the loaded policy, 1... = the selection's bank, in its order."""
        return self._selected

    @property
    def selection(self) -> PolicySelection | None:
        """The opt-in policy selection (None when off), for its counters."""
        return self._selection

    def start_selection_workers(self, count: int | None = None, wait: bool = False) -> int:
        """Compute the opt-in selection's decisions in ``count`` worker processes (default: ``selection.workers``)
        instead of in :meth:`finish_step`'s shares (control/selection_workers.py); returns how many were started (0:
        no selection, or 0 asked). ``wait``: a decision not ready when due is waited for (the in-loop numbers);
        else it is dropped and the running policy goes on (a real-time caller: the ROS controller node). Raises
        SelectionWorkerError when a worker does not start. Stop them with :meth:`close`."""
        count = self.config.selection.workers if count is None else int(count)
        if self._selection is None or count <= 0:
            return 0
        self._selection.close()
        self._selection.use_workers(SelectionWorkers(count, worker_selection, self.config, self.design, self.rho), wait)
        self._selection.prime(self._candidates)
        return count

    def close(self) -> None:
        """Stop the opt-in selection's worker processes, if any (the decisions are then computed in the loop)."""
        if self._selection is not None:
            self._selection.close()
            self._selection.use_workers(None)

    def set_policy(self, policy: Policy | None) -> None:
        """Swap the loaded swing-up policy (takes effect at the next step; the held output is dropped; with the
        opt-in selection it becomes candidate 0 and runs, and a pending decision is dropped)."""
        self._candidates[0] = policy
        self._select_candidate(0)
        if self._selection is not None:
            self._selection.cancel()
            self._selection.prime(self._candidates)

    def use_policy(self, policy: Policy | None) -> None:
        """Run ``policy`` from the next step on (its 20 ms grid restarts); the candidates stay as they are."""
        self._policy = policy
        self._next_policy_time = -math.inf

    def reset(self) -> None:
        """Forget all internal state (hysteresis flags, the held policy output, the selection's choice)."""
        self._mode = "idle"
        self._damping = False
        self._in_lqr = False
        self._lqr_locked = False
        self._held_u = 0.0
        self._lqr_since = math.nan
        self.last_cost_to_go = math.nan
        self._last_t = -math.inf
        self._command = np.zeros(2)
        if self._observer is not None:
            self._observer.reset()
        self._select_candidate(0)          # the loaded policy, the dither's configured phase
        if self._selection is not None:
            self._selection.reset()
        self._leave_catch()

    def capture_state(self) -> tuple:
        """What the next step depends on (the opt-in catch's plans aside), for :meth:`restore_state`."""
        return (self._mode, self._damping, self._in_lqr, self._lqr_locked, self._held_u, self._next_policy_time,
                self._lqr_since, self._policy, self._dither_offset)

    def restore_state(self, state: tuple) -> None:
        (self._mode, self._damping, self._in_lqr, self._lqr_locked, self._held_u, self._next_policy_time,
         self._lqr_since, self._policy, self._dither_offset) = state

    @property
    def dither_offset(self) -> float:
        """s added to the balance dither's elapsed time (0 = the configured phase; the opt-in selection's choice)."""
        return self._dither_offset

    def use_dither_offset(self, offset: float) -> None:
        """Shift the balance dither's phase by ``offset`` s from the next step on (a shake under way jumps)."""
        self._dither_offset = float(offset)

    def _select_candidate(self, index: int, dither_offset: float = 0.0) -> None:
        self._selected = index
        self.use_policy(self._candidates[index])
        self._dither_offset = dither_offset

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        """Torques (2,) in N m for state ``x`` (4,) at time ``t`` (s)."""
        u = np.zeros(2)
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (4,) or not all(map(math.isfinite, x.tolist())) or not math.isfinite(t):
            self._enter_safe()
            return u
        if self._observer is not None:
            x = self._observer.update(x, float(t), self._command)
        if self._selection is not None:
            self._select(x, float(t))
        u_act = self._actuated_torque(x, float(t))
        u[self._act] = min(max(u_act, -self._limit), self._limit) if math.isfinite(u_act) else 0.0
        if not math.isfinite(u_act):
            self._enter_safe()
        elif self._mode != "idle":       # opt-in, off by default: then the passive joint gets exactly 0
            u[1 - self._act] = self.config.friction_compensation.torque(x[3 - self._act])
        self._command = u.copy()
        return u

    @property
    def plan_pending(self) -> bool:
        """Whether the last step left work for :meth:`finish_step`: the opt-in catch's next plan, or a share of the
        opt-in selection's pending decision."""
        return ((self._catch is not None and self._catch.pending)
                or (self._selection is not None and self._selection.pending))

    def finish_step(self) -> None:
        """Work that may follow the command of the last :meth:`step`: the opt-in catch's next plan (~6 ms), the opt-in
        selection's share of its decision. A real-time caller publishes the command first, then calls this; a caller
        that does not gets the same work done when it is due, with the same numbers."""
        if self._catch is not None:
            self._catch.solve_pending()
        if self._selection is not None:
            self._selection.advance()

    def _select(self, x: np.ndarray, t: float) -> None:
        """The opt-in selection (control/selection.py): apply a decision that is due, start one when it is time."""
        selection = self._selection
        resumed = not (0.0 < t - self._last_t <= 1.5 * self.config.control_period)   # first state, or after a gap
        self._last_t = t
        if resumed:                      # as after a reset (the ROS node resets after a gap): the loaded policy
            selection.cancel()
            self._select_candidate(0)
        if selection.pending and t >= selection.due - POLICY_TICK_TOLERANCE:
            self._select_candidate(*selection.finish())
        if (not selection.pending and len(self._candidates) * len(selection.dither_offsets) > 1
                and self._candidates[0] is not None
                and (resumed or (self._mode == "policy" and t - selection.decided_at >= selection.settings.interval
                                 - POLICY_TICK_TOLERANCE))):
            selection.start(self.capture_state(), x, t, self._candidates, (self._selected, self._dither_offset),
                            self._command)

    # ---------------------------------------------------------------- modes
    def _enter_safe(self) -> None:
        self._leave_catch()
        self._command = np.zeros(2)
        if self._observer is not None:
            self._observer.reset()
        self._mode = "safe"
        self._damping = False
        self._in_lqr = False
        self._lqr_locked = False
        self._next_policy_time = -math.inf

    def _actuated_torque(self, x: np.ndarray, t: float) -> float:
        q1, q2, dq1, dq2 = x.tolist()      # floats: the same numbers as x's, at a fraction of the cost per operation
        if self._update_damping(dq1, dq2):
            self._leave_catch()
            self._mode = "damping"
            self._next_policy_time = -math.inf
            return -self.config.damping.gain * (dq1, dq2)[self._act]
        # wrap_state(x) on floats
        err = np.array((wrap_angle(q1 - math.pi) + math.pi, wrap_angle(q2), dq1, dq2)) - self.design.goal
        cost = float(err @ self.design.S @ err)
        self.last_cost_to_go = cost
        if self._update_lqr(cost, x):
            if self._mode != "lqr":
                self._lqr_since = t
            self._mode = "lqr"
            self._next_policy_time = -math.inf
            return self._balance_torque(err, cost, t) + self._dither(t)
        self._leave_catch()
        if self._policy is None:
            self._mode = "idle"
            return 0.0
        if self._mode != "policy" or t >= self._next_policy_time - POLICY_TICK_TOLERANCE:
            u_max = self.config.u_max          # the robot config bounds the swing-up policy, whatever its file says
            self._held_u = min(max(float(self._policy(x)), -u_max), u_max)
            period = self.config.policy_period
            # stay on the policy's time grid, but never schedule the next tick in the past
            grid_next = self._next_policy_time + period
            self._next_policy_time = grid_next if grid_next > t else t + period
        self._mode = "policy"
        return self._held_u

    def _balance_torque(self, err: np.ndarray, cost: float, t: float) -> float:
        """The LQR's torque, or the catch plan's in the outer band when the robot config turns it on (N m)."""
        u_lqr = -float(self._k_row @ err)
        if self._catch is None:
            return u_lqr
        if cost < self.config.catch.lqr_level * self.rho:
            self._catch.reset()
            return u_lqr
        return self._catch.torque(err + self.design.goal, t, u_lqr)

    def _leave_catch(self) -> None:
        if self._catch is not None:
            self._catch.reset()

    def _dither(self, t: float) -> float:
        """The balance dither at time ``t``, its phase counted in whole control periods since the LQR took over (the
        same number whatever float rounding the time base has: over ROS and in the evaluator alike)."""
        dither = self.config.dither
        if dither.amplitude <= 0.0:           # off (the default): nothing on the 500 Hz path
            return 0.0
        period = self.config.control_period
        return dither.torque(round((t - self._lqr_since) / period) * period + self._dither_offset)

    def _update_damping(self, dq1: float, dq2: float) -> bool:
        settings = self.config.damping
        if not settings.enabled:
            return False
        speed = max(abs(dq1), abs(dq2))
        if self._damping:
            self._damping = speed > settings.exit_speed
        else:
            self._damping = speed > settings.enter_speed
        return self._damping

    def _update_lqr(self, cost: float, x: np.ndarray) -> bool:
        roa = self.config.roa
        if self._in_lqr:
            self._in_lqr = cost <= roa.exit_fraction * self.rho
            self._lqr_locked = roa.reenter_below_line and not self._in_lqr     # a lost catch
        else:
            if self._lqr_locked and self._model.end_effector_height(x) <= self._model.height_threshold:
                self._lqr_locked = False
            self._in_lqr = not self._lqr_locked and cost < roa.enter_fraction * self.rho
        return self._in_lqr


def worker_selection(config: RobotConfig, design: LqrDesign, rho: float) -> PolicySelection | None:
    """A selection worker's own selection machinery: the same shadow supervisor and model the live supervisor
    builds (control/selection_workers.py)."""
    return Supervisor(config, design, rho).selection
