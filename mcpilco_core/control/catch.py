"""The catch: a receding-horizon plan (iLQR) that takes over from the LQR at the edge of the balancing band.

Why: the acrobot's LQR (gains of ~330 N m/rad on q1) saturates at 6 N m for errors of 0.02 rad, so it drops most
of the states the swing-up policy hands over at the band's edge (V = 7-8 rho). A plan over 0.8 s knows the torque
limit and the nonlinear dynamics the linear feedback does not: with it the shipped acrobot policy scores 0.423 /
0.446 on protocol seeds 0-9 / 10-19 instead of 0.407 / 0.402 (docs/learner.md, "The catch").

Two parts, kept apart as in moteus' build/send split:

* :class:`CatchPlanner` - pure computation: from a state, improve a sequence of held torques (one per ``period``)
  by iLQR on the controller's plant (the robot config's model, never the simulated robot), bounded by the torque
  limit; the cost is the LQR's own (Q, R, and its cost-to-go S at the end), so the plan ends where the LQR takes
  over. Deterministic: every plan starts from the saturated LQR run on the model.
* :class:`CatchController` - the real-time schedule. A plan takes time to solve (~6 ms here), so it is always
  solved one period ahead, from the state the model predicts for the period's end: when the band is entered the
  LQR holds the first period while the first plan is solved; at every period boundary after that the torque
  ``U0 + K0 (x - X0)`` (the plan's torque, corrected by its feedback gains for the prediction's error) is held for
  the period, and the next plan is solved. The solve is left pending when the command is returned: the controller
  node solves it after publishing the command (``Supervisor.finish_step``), so the command at a period boundary
  does not wait for it, and a caller that never calls ``solve_pending`` gets it solved at the start of its next
  step. Either way the plan is the same (it depends only on the predicted state), so the evaluator and the node
  give the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..config import CatchConfig, RobotConfig
from ..plant import GOAL, DoublePendulum, wrap_angle, wrap_state
from .lqr import LqrDesign

LINE_SEARCH = (1.0, 0.5, 0.25, 0.1, 0.03, 0.01)   # step fractions tried in turn (small ones: chaotic runs)
REGULARISATION = 1e-6     # added to the torque's curvature (1/(N m)^2 scale) of each backward step
FD_STEP = 1e-6            # finite-difference step of the Jacobians (rad, rad/s, N m)
TIME_TOLERANCE = 1e-9     # s


def goal_error(x: tuple | np.ndarray) -> np.ndarray:
    """x - goal with both angle errors wrapped to [-pi, pi) (rad, rad/s)."""
    e = np.asarray(x, dtype=np.float64) - GOAL
    e[..., :2] = wrap_angle(e[..., :2])
    return e


@dataclass(frozen=True)
class CatchPlan:
    """A plan from ``states[0]``: ``torques[k]`` (N m, actuated joint) held over period k, the model's ``states``
    (N+1, 4) under them, the feedback ``gains`` (N, 4) (N m per rad, rad/s) around them, and the plan's cost."""

    torques: np.ndarray
    states: np.ndarray
    gains: np.ndarray
    cost: float

    def torque_at_start(self, x: np.ndarray, limit: float) -> float:
        """The first period's torque for the measured (wrapped) state ``x``: U0 + K0 (x - X0), clipped (N m)."""
        dx = np.asarray(x, dtype=np.float64) - self.states[0]
        dx[:2] = wrap_angle(dx[:2])
        return min(max(float(self.torques[0] + self.gains[0] @ dx), -limit), limit)


class CatchPlanner:
    """iLQR on ``plant`` for the actuated joint only (the passive joint gets 0 in the model as on the robot).

    Cost (the LQR's, integrated over the plan): sum_k period (e_k' Q e_k + R u_k^2) + e_N' S e_N, e = x - goal
    with wrapped angles. Torques are bounded by ``torque_limit``: a step that would leave the bound is clamped
    and gets no feedback (a simple box-constrained iLQR).
    """

    def __init__(self, plant: DoublePendulum, design: LqrDesign, q_diag: tuple[float, ...], r: float,
                 torque_limit: float, period: float, steps: int, integration_step: float) -> None:
        self.plant = plant
        self.act = design.actuated_joint
        self.q = np.diag(np.asarray(q_diag, dtype=np.float64)) * period
        self.r = float(r) * period
        self.s = np.asarray(design.S, dtype=np.float64)
        self.limit = float(torque_limit)
        self.period = float(period)
        self.steps = int(steps)
        self.substeps = max(1, math.ceil(period / integration_step - 1e-9))
        self._k_row = np.asarray(design.K[self.act], dtype=np.float64)

    # ------------------------------------------------------------------ the model
    def _torques(self, u: float) -> tuple[float, float]:
        return (0.0, u) if self.act == 1 else (u, 0.0)

    def advance(self, x: tuple, u: float) -> tuple:
        """The model's state one ``period`` after ``x`` with ``u`` (N m) held on the actuated joint."""
        h = self.period / self.substeps
        uu = self._torques(u)
        for _ in range(self.substeps):
            x = self.plant.rk4_step_scalar(x, uu, h)
        return x

    def advance_lqr(self, x: tuple, control_period: float) -> tuple:
        """The model's state one ``period`` after ``x`` under the saturated LQR at the state rate (what the
        supervisor does while the first plan is solved)."""
        for _ in range(max(1, round(self.period / control_period))):
            u = min(max(-float(self._k_row @ goal_error(x)), -self.limit), self.limit)
            x = self.plant.rk4_step_scalar(x, self._torques(u), control_period)
        return x

    def _advance_batch(self, x: np.ndarray, u: np.ndarray) -> np.ndarray:
        torques = np.zeros((len(u), 2))
        torques[:, self.act] = u
        h = self.period / self.substeps
        for _ in range(self.substeps):
            x = self.plant.rk4_step(x, torques, h)
        return x

    def _jacobians(self, states: np.ndarray, torques: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A_k (N, 4, 4) and B_k (N, 4) of the one-period map along the plan (forward differences, one batch)."""
        n = self.steps
        x = np.repeat(states[:n], 6, axis=0)
        u = np.repeat(torques, 6)
        for i in range(4):
            x[i + 1::6, i] += FD_STEP
        u[5::6] += FD_STEP
        out = self._advance_batch(x, u).reshape(n, 6, 4)
        a = np.transpose((out[:, 1:5] - out[:, :1]) / FD_STEP, (0, 2, 1))
        b = (out[:, 5] - out[:, 0]) / FD_STEP
        return a, b

    # ------------------------------------------------------------------ rollouts
    def _run(self, x0: tuple, control: Callable[[int, tuple], float], gains: np.ndarray | None = None) -> CatchPlan:
        """The model from ``x0`` with ``control(k, x)`` (N m, clipped to the limit) held over each period k: the
        states, torques and cost of one rollout (every rollout of the planner is this loop)."""
        states = np.empty((self.steps + 1, 4))
        states[0] = x0
        torques = np.empty(self.steps)
        x, cost = tuple(float(v) for v in x0), 0.0
        for k in range(self.steps):
            u = min(max(control(k, x), -self.limit), self.limit)
            torques[k] = u
            e = goal_error(x)
            cost += float(e @ self.q @ e) + self.r * u * u
            x = self.advance(x, u)
            states[k + 1] = x
        e = goal_error(x)
        return CatchPlan(torques, states, np.zeros((self.steps, 4)) if gains is None else gains,
                         cost + float(e @ self.s @ e))

    def rollout(self, x0: tuple, torques: np.ndarray) -> CatchPlan:
        """The model's states and the cost of holding ``torques`` (clipped to the limit) from ``x0``."""
        return self._run(x0, lambda k, x: float(torques[k]))

    def lqr_run(self, x0: tuple) -> CatchPlan:
        """The saturated LQR run on the model, its torque held per period: the first guess of every plan."""
        return self._run(x0, lambda k, x: -float(self._k_row @ goal_error(x)))

    def _forward(self, x0: tuple, plan: CatchPlan, step: np.ndarray, gains: np.ndarray, alpha: float) -> CatchPlan:
        def control(k: int, x: tuple) -> float:
            dx = np.asarray(x) - plan.states[k]
            dx[:2] = wrap_angle(dx[:2])
            return float(plan.torques[k] + alpha * step[k] + gains[k] @ dx)

        return self._run(x0, control, gains)

    # ------------------------------------------------------------------ iLQR
    def _backward(self, plan: CatchPlan) -> tuple[np.ndarray, np.ndarray]:
        a, b = self._jacobians(plan.states, plan.torques)
        e_end = goal_error(plan.states[-1])
        vx, vxx = 2.0 * self.s @ e_end, 2.0 * self.s
        step, gains = np.zeros(self.steps), np.zeros((self.steps, 4))
        for k in range(self.steps - 1, -1, -1):
            e = goal_error(plan.states[k])
            u = plan.torques[k]
            qx = 2.0 * self.q @ e + a[k].T @ vx
            qu = 2.0 * self.r * u + b[k] @ vx
            qxx = 2.0 * self.q + a[k].T @ vxx @ a[k]
            quu = 2.0 * self.r + b[k] @ vxx @ b[k] + REGULARISATION
            if quu <= 0.0:
                quu = 2.0 * self.r + REGULARISATION
            qux = b[k] @ vxx @ a[k]
            kk, gain = -qu / quu, -qux / quu
            if abs(u + kk) > self.limit:          # the step would leave the bound: clamp it, no feedback there
                kk = math.copysign(self.limit, u + kk) - u
                gain = np.zeros(4)
            step[k], gains[k] = kk, gain
            vx = qx + gain * quu * kk + gain * qu + qux * kk
            vxx = qxx + quu * np.outer(gain, gain) + np.outer(gain, qux) + np.outer(qux, gain)
            vxx = 0.5 * (vxx + vxx.T)
        return step, gains

    def improve(self, x0: tuple, plan: CatchPlan, iterations: int) -> CatchPlan:
        """Up to ``iterations`` iLQR steps from the guess ``plan`` (a rollout from ``x0``); each is kept only if it
        lowers the cost."""
        for _ in range(iterations):
            step, gains = self._backward(plan)
            for alpha in LINE_SEARCH:
                candidate = self._forward(x0, plan, step, gains, alpha)
                if candidate.cost < plan.cost:
                    plan = candidate
                    break
            else:
                break
        return plan

    def plan(self, x0: tuple, iterations: int) -> CatchPlan:
        """A plan from ``x0``, improved from the saturated LQR's run on the model. (Warm-starting from the previous
        plan scored lower on the protocol, 0.408 against 0.426 on seeds 200-223: a plan that failed stays failed.)"""
        return self.improve(x0, self.lqr_run(x0), iterations)


class CatchController:
    """The schedule of the plans inside the band (see the module docstring). ``torque`` is called at every state
    (500 Hz) while the supervisor is in the band, ``reset`` whenever it leaves."""

    def __init__(self, planner: CatchPlanner, settings: CatchConfig, control_period: float) -> None:
        self.planner = planner
        self.settings = settings
        self.control_period = float(control_period)
        self.reset()

    def reset(self) -> None:
        self._plan: CatchPlan | None = None     # solved for the state predicted at _plan_time
        self._pending: tuple | None = None      # the predicted state whose plan is still to be solved
        self._plan_time = math.nan
        self._held: float | None = None         # None: the LQR holds the current period
        self.plans_solved = 0

    @property
    def active(self) -> bool:
        """Whether a plan's torque (not the LQR's) is being held."""
        return self._held is not None

    def torque(self, x_wrapped: np.ndarray, t: float, lqr_torque: float) -> float:
        """The actuated joint's torque (N m) at time ``t`` (s) for the measured, wrapped state. At a period boundary
        the next plan is left pending (:meth:`solve_pending`), so this returns without solving it."""
        self.solve_pending()                # the caller did not solve the last one after its command: now
        if self._plan is None:              # just entered: the LQR holds this period, the first plan is to be solved
            self._pending = self.planner.advance_lqr(tuple(float(v) for v in x_wrapped), self.control_period)
            self._plan_time = t + self.planner.period
            return lqr_torque
        if t >= self._plan_time - TIME_TOLERANCE:
            self._held = self._plan.torque_at_start(x_wrapped, self.planner.limit)
            self._pending = self.planner.advance(tuple(float(v) for v in x_wrapped), self._held)
            self._plan_time = t + self.planner.period
        return lqr_torque if self._held is None else self._held

    @property
    def pending(self) -> bool:
        """Whether a plan is waiting to be solved (the last step crossed a period boundary or entered the band)."""
        return self._pending is not None

    def solve_pending(self) -> None:
        """Solve the plan the last :meth:`torque` left pending (nothing when none is): the controller node calls it
        after publishing the command, so that command does not wait for the ~6 ms solve."""
        if self._pending is None:
            return
        x0 = tuple(float(v) for v in wrap_state(np.asarray(self._pending)))
        self._pending = None
        self._plan = self.planner.plan(x0, self.settings.iterations)
        self.plans_solved += 1


def build_catch(plant: DoublePendulum, design: LqrDesign, config: RobotConfig) -> CatchController | None:
    """The robot config's catch (None when ``catch.enabled`` is false): planned on the config's own plant."""
    settings: CatchConfig = config.catch
    if not settings.enabled:
        return None
    steps = max(1, round(settings.horizon / settings.period))
    planner = CatchPlanner(plant, design, config.lqr.Q_diag, config.lqr.R, config.torque_limit, settings.period,
                           steps, settings.integration_step)
    return CatchController(planner, settings, config.control_period)
