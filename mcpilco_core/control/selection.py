"""Choosing among several swing-up policies by simulating each on the robot config's plant (opt-in).

Why: policies learnt from the same trials fail on different states. On the acrobot, whose recoveries are caught on
their first arrival at the top only 6 % of the time (docs/learner.md, "Where the acrobot's second now goes"), the
shipped policy and its polished relatives (all from the same 64 s of robot time) each keep the pendulum above the
score's line longest after a different share of the disturbances. A controller can pick among them before the fact
when it has a model: run each candidate, through this supervisor (LQR, band, damping), on the robot config's own
plant -- never the simulated robot's -- and keep the one that stays above the line longest. This is "a separate
policy per regime" with the regimes drawn by the model, not by hand; the policies themselves stay MC-PILCO's.

How: a decision starts while a policy is in charge, every ``interval`` s, and whenever the states resume after a
gap (the robot was away: a disturbance window the controller does not see; the loaded policy then runs until the
decision is due, as after the ROS node's reset). From the measured state, the running
policy is simulated ``lead`` s ahead; from that predicted state each candidate is simulated ``horizon`` s with the
supervisor's own logic, counting the time above the line; the best one takes over at the predicted time if it
beats the running one by more than ``margin`` s (otherwise the running one goes on; either way the policy's
20 ms grid restarts then). With ``dither_phases`` > 1 each candidate is simulated once per starting phase of the
balance dither (evenly spaced over its period; 2 = the shake's first push one way or the other), and the pair that
stays up longest is chosen: on a robot whose passive joint sticks, which way the first push goes decides many
catches (docs/learner.md, "Choosing the shake's phase too"). With ``delay`` > 0 the simulations' supervisor sees
states as old as the robot's sensors report them: on a design robot with the proxy's 5 ms delay and no velocity
noise, the delay-free simulations had lost most of the selection's gain and this gave it back (docs/learner.md, "The
robot's delay in the selection's simulations"). With ``noise_samples`` > 0 the ``finalists`` options that the
noise-free simulations rank best, and the running one, are simulated again ``noise_samples`` times each with the
robot's measurement noise (added to what the supervisor sees) and torque noise (added to the actuated joint's
command), the same draws for every finalist, and the mean time above the line decides among them: a noise-free
simulation rewards arrivals that only an exact state catches (docs/learner.md, "Noisy finals in the selection").
The work is spread evenly over the ``lead`` s:
``advance`` does a fixed share after each command, so a decision costs every control step the same and is always
ready on time. A caller that never calls ``advance`` (the evaluator) gets the rest computed when the decision is
due: the same numbers.

Units: s, rad, rad/s, N m.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence

import numpy as np

from ..plant import DoublePendulum

Policy = Callable[[np.ndarray], float]


def _clip(value: float, limit: float) -> float:
    return min(max(value, -limit), limit)


class PolicySelection:
    """The decision machinery (module docstring). ``shadow`` is a supervisor of the same config without a selection;
    it is stepped on the model and never touches the robot. Candidates are indexed as the supervisor gives them; an
    option is a candidate with a dither offset: (index, s added to the shake's elapsed time)."""

    def __init__(self, shadow, plant: DoublePendulum, settings, control_period: float,
                 torque_limits: tuple[float, float]) -> None:
        self.shadow = shadow
        self.plant = plant
        self.settings = settings
        self.dt = float(settings.step)                                   # s, the simulations' step
        self.limits = (float(torque_limits[0]), float(torque_limits[1]))
        self.lead_periods = max(1, int(round(settings.lead / control_period)))   # control steps until due
        self.lead_steps = max(1, int(round(settings.lead / self.dt)))
        self.horizon_steps = max(1, int(round(settings.horizon / self.dt)))
        self.delay_steps = int(settings.delay / self.dt)     # as the robot profile's delay: int(delay / dt)
        dither = shadow.config.dither
        phases = settings.dither_phases if dither.amplitude > 0.0 else 1
        self.dither_offsets = tuple(k / (phases * dither.frequency) for k in range(phases))   # s
        self._lengths = (float(plant.params.l[0]), float(plant.params.l[1]))
        self._act = shadow.config.actuated_joint                          # where the torque noise goes
        self._line = float(plant.height_threshold)
        self.decisions = 0                   # decisions started since this selection was made (resets keep it)
        self.reset()

    def reset(self) -> None:
        self.cancel()
        self.decided_at = -math.inf          # s, when the last decision started
        self.last_options: list[tuple[int, float]] = []   # (candidate, dither offset) of the last decision
        self.last_values: list[float] = []   # s above the line, per option, of the last decision (with noisy finals:
                                             # the finalists and their mean noisy values)

    # ---------------------------------------------------------------- the decision's life
    @property
    def pending(self) -> bool:
        return self._work is not None

    @property
    def due(self) -> float:
        return self._due

    def cancel(self) -> None:
        self._work: Iterator[None] | None = None
        self._due = math.inf
        self._choice: tuple[int, float] | None = None

    def start(self, state: tuple, x: np.ndarray, t: float, candidates: Sequence[Policy],
              running: tuple[int, float]) -> None:
        """Begin a decision for the state measured at ``t`` (the live supervisor's ``state`` before this step);
        ``running``: the option in charge (candidate index, dither offset in s)."""
        self.decided_at = t
        self.decisions += 1
        self._due = t + self.lead_steps * self.dt
        self._choice = None
        options = [(index, offset) for index in range(len(candidates)) for offset in self.dither_offsets]
        if running not in options:
            options.append(running)
        finalists = min(self.settings.finalists, len(options)) + 1 if self.settings.noise_samples > 0 else 0
        total = self.lead_steps + (len(options) + finalists * self.settings.noise_samples) * self.horizon_steps
        self._chunk = -(-total // self.lead_periods)    # steps of simulation per advance: done within the lead
        self._work = self._decide(state, tuple(float(v) for v in x), t, list(candidates), options, running)

    def advance(self) -> None:
        """Do this control step's share of the pending decision (after the command went out)."""
        if self._work is None or self._choice is not None:
            return
        for _ in range(self._chunk):
            if next(self._work, StopIteration) is StopIteration:
                return

    def finish(self) -> tuple[int, float]:
        """The decision's choice (candidate index, dither offset), computing whatever is left; the decision is then
        over."""
        while self._choice is None:
            if next(self._work, StopIteration) is StopIteration:
                break
        choice = self._choice
        self.cancel()
        return choice

    # ---------------------------------------------------------------- the simulations
    def _decide(self, state: tuple, x: tuple, t: float, candidates: list, options: list,
                running: tuple[int, float]) -> Iterator[None]:
        shadow = self.shadow
        shadow.restore_state(state)
        x_due, _ = yield from self._rollout(x, t, self.lead_steps)
        t_due, state_due = t + self.lead_steps * self.dt, shadow.capture_state()
        values = []
        for index, offset in options:
            shadow.restore_state(state_due)
            shadow.use_policy(candidates[index])
            shadow.use_dither_offset(offset)
            _, up = yield from self._rollout(x_due, t_due, self.horizon_steps)
            values.append(self._value(up))
        if self.settings.noise_samples > 0:
            options, values = yield from self._noisy_finals(state_due, x_due, t_due, candidates, options, values,
                                                            running)
        self.last_options, self.last_values = options, values
        best = int(np.argmax(values))
        keep = values[options.index(running)]
        self._choice = options[best] if values[best] > keep + self.settings.margin else running

    def _noisy_finals(self, state_due: tuple, x_due: tuple, t_due: float, candidates: list, options: list,
                      values: list, running: tuple[int, float]) -> Generator[None, None, tuple[list, list]]:
        """The ``finalists`` best options by ``values`` and the running one, each valued by the mean time above the
        line of ``noise_samples`` simulations with the robot's noise. Sample j's noise is the same for every
        finalist (common random numbers: the finalists are compared on the same luck) and is seeded by the decision's
        number and j, so a decision's numbers do not depend on how its work was spread."""
        order = sorted(range(len(options)), key=lambda i: -values[i])[:self.settings.finalists]
        finals = [options[i] for i in order]
        if running not in finals:
            finals.append(running)
        samples = self.settings.noise_samples
        draws = []
        for j in range(samples):
            rng = np.random.default_rng((self.decisions, j))
            draws.append((rng.standard_normal((self.horizon_steps, 4)) * np.asarray(self.settings.measurement_noise),
                          rng.standard_normal(self.horizon_steps) * self.settings.torque_noise))
        noisy = []
        for index, offset in finals:
            total = 0.0
            for noise in draws:
                self.shadow.restore_state(state_due)
                self.shadow.use_policy(candidates[index])
                self.shadow.use_dither_offset(offset)
                _, up = yield from self._rollout(x_due, t_due, self.horizon_steps, noise)
                total += self._value(up)
            noisy.append(total / samples)
        return finals, noisy

    def _value(self, up: int) -> float:
        """What an option's simulation is worth (s above the line), the shadow as the simulation left it."""
        return up * self.dt

    def _rollout(self, x: tuple, t: float, steps: int,
                 noise: tuple[np.ndarray, np.ndarray] | None = None) -> Generator[None, None, tuple[tuple, int]]:
        """``steps`` simulation steps of the shadow on the model from ``x`` at ``t``, yielding after each; returns
        the last state and the number of states above the line. With ``delay`` the supervisor sees the state
        ``delay_steps`` steps old (``x`` itself until the simulation has that many). ``noise``: (steps, 4) added to
        what the supervisor sees and (steps,) N m added to the actuated joint's command (then clipped)."""
        shadow, plant, dt = self.shadow, self.plant, self.dt
        l1, l2 = self._lengths
        lim0, lim1 = self.limits
        up = 0
        seen = deque([x], maxlen=self.delay_steps + 1)                    # seen[0]: what the sensors report
        for k in range(steps):
            reading = np.array(seen[0]) if noise is None else np.array(seen[0]) + noise[0][k]
            u = shadow.step(reading, t + k * dt)
            u0, u1 = float(u[0]), float(u[1])
            if noise is not None:
                if self._act == 0:
                    u0 += float(noise[1][k])
                else:
                    u1 += float(noise[1][k])
            x = plant.rk4_step_scalar(x, (_clip(u0, lim0), _clip(u1, lim1)), dt)
            seen.append(x)
            if -l1 * math.cos(x[0]) - l2 * math.cos(x[0] + x[1]) > self._line:
                up += 1
            yield
        return x, up
