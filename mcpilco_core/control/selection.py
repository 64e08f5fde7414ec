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
from .selection_workers import SelectionWorkerError, SelectionWorkers

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
        self._branches: dict = {}            # this decision's branch points: (candidate, sample) -> (point, value)
        self._workers: SelectionWorkers | None = None
        self._wait_for_workers = True
        self._outstanding = 0                # answers the workers still owe, stale decisions' included
        self.late_decisions = 0              # with workers, real time: decisions not ready when due, or not started
        self.failure = ""                    # why the workers stopped (then no more decisions: the running one goes on)
        self.reset()

    def use_workers(self, workers: SelectionWorkers | None, wait: bool = True) -> None:
        """Compute the decisions in ``workers`` (None: in this process, spread over the lead by :meth:`advance`).
        ``wait``: a decision not ready when due is waited for (the in-loop numbers: the evaluator); else (a real-time
        caller) it is dropped, the running option goes on, and no decision starts while the workers are still busy
        with an earlier one; both count in ``late_decisions``."""
        self.cancel()
        self._workers = workers
        self._wait_for_workers = wait
        self._outstanding = 0

    @property
    def worker_count(self) -> int:
        """Worker processes computing the decisions (0: in this process)."""
        return self._workers.count if self._workers is not None else 0

    def prime(self, candidates: Sequence[Policy]) -> None:
        """Send the workers the candidates now (a decision sends them when they changed, which would cost its
        control step the pickling: ~ms for a bank of twelve)."""
        if self._workers is not None:
            try:
                self._workers.send_candidates(candidates)
            except SelectionWorkerError as exc:
                self._fail(exc)

    def close(self) -> None:
        """Stop the workers, if any (the decisions are then computed in this process)."""
        if self._workers is not None:
            self._workers.close()
        self._workers = None

    def reset(self) -> None:
        self.cancel()
        self.decided_at = -math.inf          # s, when the last decision started
        self.last_options: list[tuple[int, float]] = []   # (candidate, dither offset) of the last decision
        self.last_values: list[float] = []   # s above the line, per option, of the last decision (with noisy finals:
                                             # the finalists and their mean noisy values)

    # ---------------------------------------------------------------- the decision's life
    @property
    def pending(self) -> bool:
        return self._work is not None or self._remote is not None

    @property
    def ready(self) -> bool:
        """Whether the pending decision's choice is known (with workers: all their answers are in)."""
        if self._remote is not None:
            return self._remote["done"]
        return self._choice is not None

    @property
    def due(self) -> float:
        return self._due

    def cancel(self) -> None:
        self._work: Iterator[None] | None = None
        self._remote: dict | None = None     # a decision the workers compute
        self._due = math.inf
        self._choice: tuple[int, float] | None = None

    def start(self, state: tuple, x: np.ndarray, t: float, candidates: Sequence[Policy],
              running: tuple[int, float], command: Sequence[float] = (0.0, 0.0)) -> None:
        """Begin a decision for the state measured at ``t`` (the live supervisor's ``state`` before this step);
        ``running``: the option in charge (candidate index, dither offset in s); ``command``: the torques (N m) the
        supervisor gave last, acting on the robot while the sensors are late (``predict_delay``)."""
        self.decided_at = t
        if self.failure:
            return
        if self._workers is not None and not self._wait_for_workers and self._outstanding > 0:
            self._collect(0.0)              # a dropped decision's answers
            if self._outstanding > 0 or self.failure:
                self.late_decisions += 1    # the workers are still on an earlier decision: none this time
                return
        self.decisions += 1
        self._due = t + self.lead_steps * self.dt
        self._choice = None
        options = [(index, offset) for index in range(len(candidates)) for offset in self.dither_offsets]
        if running not in options:
            options.append(running)
        command = (float(command[0]), float(command[1]))
        if self._workers is not None:
            self._start_remote(state, tuple(float(v) for v in x), command, t, list(candidates), options, running)
            return
        finalists = min(self.settings.finalists, len(options)) + 1 if self.settings.noise_samples > 0 else 0
        total = self.lead_steps + (len(options) + finalists * self.settings.noise_samples) * self.horizon_steps
        self._chunk = -(-total // self.lead_periods)    # steps of simulation per advance: done within the lead
        self._work = self._decide(state, tuple(float(v) for v in x), command, t, list(candidates), options, running)

    def advance(self) -> None:
        """Do this control step's share of the pending decision (after the command went out); with workers,
        collect what they have answered."""
        if self._remote is not None:
            self._collect(0.0)
            return
        if self._work is None or self._choice is not None:
            return
        for _ in range(self._chunk):
            if next(self._work, StopIteration) is StopIteration:
                return

    def finish(self) -> tuple[int, float]:
        """The decision's choice (candidate index, dither offset), computing whatever is left; the decision is then
        over."""
        if self._remote is not None:
            return self._finish_remote()
        while self._choice is None:
            if next(self._work, StopIteration) is StopIteration:
                break
        choice = self._choice
        self.cancel()
        return choice

    # ---------------------------------------------------------------- a decision in the workers
    def _start_remote(self, state: tuple, x: tuple, command: tuple, t: float, candidates: list, options: list,
                      running: tuple[int, float]) -> None:
        if state[7] is not candidates[running[0]]:
            raise ValueError("the supervisor's running policy is not the running candidate")
        self._remote = {"args": (self.decisions, state, x, command, t, running[0], self.decisions),
                        "candidates": candidates, "options": options, "running": running, "kind": "values",
                        "answers": [], "done": False}
        self._send_round("values", list(enumerate(options)))

    def _send_round(self, kind: str, tasks: list) -> None:
        remote = self._remote
        remote["kind"], remote["answers"] = kind, []
        try:
            remote["expected"] = self._workers.send_round(kind, *remote["args"], tasks, remote["candidates"])
        except SelectionWorkerError as exc:
            self._fail(exc)
            return
        self._outstanding += remote["expected"]

    def _collect(self, timeout: float | None) -> None:
        """Take the workers' answers (waiting up to ``timeout`` s for one); a round complete starts the next one or
        concludes the decision."""
        try:
            answers = self._workers.receive(timeout)
        except SelectionWorkerError as exc:
            self._fail(exc)
            return
        self._outstanding -= len(answers)
        remote = self._remote
        if remote is None or remote["done"]:
            return
        remote["answers"].extend(items for kind, decision_id, items in answers
                                 if decision_id == remote["args"][0] and kind == remote["kind"])
        if len(remote["answers"]) < remote["expected"]:
            return
        results = [item for items in remote["answers"] for item in items]
        if remote["kind"] == "values":
            values = [value for _, value in sorted(results)]
            if self.settings.noise_samples > 0:
                remote["finals"] = self.finalists(remote["options"], values, remote["running"])
                self._send_round("noisy", [(k, option, j) for k, option in enumerate(remote["finals"])
                                           for j in range(self.settings.noise_samples)])
                return
            self._conclude(remote["options"], values, remote["running"])
        else:
            samples: dict[int, dict[int, float]] = {}
            for k, j, value in results:
                samples.setdefault(k, {})[j] = value
            values = [self.noisy_value([samples[k][j] for j in sorted(samples[k])]) for k in range(len(samples))]
            self._conclude(remote["finals"], values, remote["running"])
        remote["done"] = True

    def _finish_remote(self) -> tuple[int, float]:
        running = self._remote["running"]
        while self._remote is not None and not self._remote["done"] and self._wait_for_workers:
            self._collect(None)
        if self._remote is not None and not self._remote["done"]:
            self._collect(0.0)
        if self._remote is not None and not self._remote["done"]:        # real time: not ready when due
            self.late_decisions += 1
            self._choice = running
        choice = self._choice if self._choice is not None else running
        self.cancel()
        return choice

    def _fail(self, exc: SelectionWorkerError) -> None:
        """Workers that failed: no more decisions (the running option goes on); ``failure`` says why."""
        self.failure = str(exc)
        self._remote = None
        self.close()

    # ---------------------------------------------------------------- the simulations
    def _decide(self, state: tuple, x: tuple, command: tuple, t: float, candidates: list, options: list,
                running: tuple[int, float]) -> Iterator[None]:
        due = yield from self._lead(state, x, t, command)
        values = []
        for option in options:
            values.append((yield from self._simulate(due, candidates, option)))
        if self.settings.noise_samples > 0:
            options = self.finalists(options, values, running)
            values = []
            for option in options:
                samples = []
                for j in range(self.settings.noise_samples):
                    samples.append((yield from self._simulate(due, candidates, option,
                                                              self.noise(self.decisions, j), j)))
                values.append(self.noisy_value(samples))
        self._conclude(options, values, running)

    def _conclude(self, options: list, values: list, running: tuple[int, float]) -> None:
        """The choice from the options' values: the best one if it beats the running one by more than the margin."""
        self.last_options, self.last_values = options, values
        best = int(np.argmax(values))
        keep = values[options.index(running)]
        self._choice = options[best] if values[best] > keep + self.settings.margin else running

    def finalists(self, options: list, values: list, running: tuple[int, float]) -> list:
        """The ``finalists`` best options by their noise-free ``values``, then the running one if it is not among
        them: the options the noisy simulations value again."""
        order = sorted(range(len(options)), key=lambda i: -values[i])[:self.settings.finalists]
        finals = [options[i] for i in order]
        if running not in finals:
            finals.append(running)
        return finals

    def noise(self, decision: int, sample: int) -> tuple[np.ndarray, np.ndarray]:
        """Noisy simulation ``sample``'s noise in decision number ``decision``: (horizon steps, 4) added to what the
        supervisor sees (rad, rad/s) and (horizon steps,) N m added to the actuated joint's command. The same for
        every finalist (common random numbers: the finalists are compared on the same luck) and seeded by the two
        numbers alone, so a decision's numbers do not depend on how or where its work was done."""
        rng = np.random.default_rng((decision, sample))
        return (rng.standard_normal((self.horizon_steps, 4)) * np.asarray(self.settings.measurement_noise),
                rng.standard_normal(self.horizon_steps) * self.settings.torque_noise)

    def noisy_value(self, samples: Sequence[float]) -> float:
        """A finalist's value: the mean of its noisy simulations' values, summed in sample order."""
        total = 0.0
        for value in samples:
            total += value
        return total / len(samples)

    def _lead(self, state: tuple, x: tuple, t: float,
              command: tuple = (0.0, 0.0)) -> Generator[None, None, tuple[tuple, float, tuple, tuple | None]]:
        """The running option simulated ``lead`` s from the live supervisor's ``state``, measured ``x`` at ``t``;
        returns what every option starts from: (state, time, supervisor state, the readings the supervisor has still
        to see: None = the state itself) at the due time. With ``predict_delay`` the measured ``x`` is the robot's
        state ``delay_steps`` steps ago: the model first catches up with the robot over them, with ``command`` held
        (the torques acting meanwhile), and the simulated supervisor goes on seeing the states that old."""
        self._branches = {}
        self.shadow.restore_state(state)
        seen = self._catch_up(x, command) if self.settings.predict_delay and self.delay_steps > 0 else None
        x_due, _ = yield from self._rollout(seen[-1] if seen else x, t, self.lead_steps, None, seen)
        return (x_due, t + self.lead_steps * self.dt, self.shadow.capture_state(),
                tuple(seen) if seen is not None else None)

    def _catch_up(self, x: tuple, command: tuple) -> deque:
        """The model from the measured ``x`` over the sensors' ``delay_steps``, ``command`` held: the readings from
        ``x`` to the robot's state now, oldest first (what the supervisor sees next, then what it will see)."""
        u = (_clip(command[0], self.limits[0]), _clip(command[1], self.limits[1]))
        seen = deque([x], maxlen=self.delay_steps + 1)
        for _ in range(self.delay_steps):
            seen.append(self.plant.rk4_step_scalar(seen[-1], u, self.dt))
        return seen

    def _simulate(self, due: tuple, candidates: list, option: tuple[int, float],
                  noise: tuple[np.ndarray, np.ndarray] | None = None,
                  sample: int | None = None) -> Generator[None, None, float]:
        """An option's (candidate index, dither offset) simulation of ``horizon`` s from ``due`` (:meth:`_lead`'s);
        returns its value. ``sample``: which noisy sample ``noise`` is (its number in the decision), None for the
        noise-free simulation.

        Options that differ only in the dither's phase are the same simulation until the LQR first balances (the dither
        acts only then), so with several phases the first one of a candidate (and sample) records where that happened
        and the others go on from there, with their own phase; one that never reached the LQR has the same value in
        every phase. The values are those of whole simulations, bit for bit (``test_policy_selection.py``): a fifth
        fewer simulated steps per decision for the acrobot's phases config."""
        x_due, t_due, state_due, readings = due
        index, offset = option
        key = (index, sample) if len(self.dither_offsets) > 1 and (noise is None or sample is not None) else None
        branch = self._branches.get(key) if key is not None else None
        if branch is not None:
            point, value = branch
            if point is None:                           # never shaken: every phase is this simulation
                return value
            x, seen, up, state, k = point
            self.shadow.restore_state(state)
            self.shadow.use_dither_offset(offset)
            _, up = yield from self._rollout(x, t_due, self.horizon_steps, noise,
                                             deque(seen, maxlen=self.delay_steps + 1), start=k, up=up)
            return self._value(up)
        self.shadow.restore_state(state_due)
        self.shadow.use_policy(candidates[index])
        self.shadow.use_dither_offset(offset)
        seen = deque(readings, maxlen=self.delay_steps + 1) if readings is not None else None
        record = {} if key is not None else None
        _, up = yield from self._rollout(x_due, t_due, self.horizon_steps, noise, seen, record=record)
        value = self._value(up)
        if key is not None:
            self._branches[key] = (record.get("point"), value)
        return value

    def _value(self, up: int) -> float:
        """What an option's simulation is worth (s above the line), the shadow as the simulation left it."""
        return up * self.dt

    def _rollout(self, x: tuple, t: float, steps: int, noise: tuple[np.ndarray, np.ndarray] | None = None,
                 seen: deque | None = None, *, start: int = 0, up: int = 0,
                 record: dict | None = None) -> Generator[None, None, tuple[tuple, int]]:
        """``steps`` simulation steps of the shadow on the model from ``x`` at ``t``, yielding after each; returns
        the last state and the number of states above the line. With ``delay`` the supervisor sees the state
        ``delay_steps`` steps old (``x`` itself until the simulation has that many). ``noise``: (steps, 4) added to
        what the supervisor sees and (steps,) N m added to the actuated joint's command (then clipped). ``seen``: the
        readings still to come, oldest first, ``x`` the last (None: ``x`` alone); left as the rollout ends them.
        ``start``, ``up``: go on from step ``start`` of such a rollout (``x`` and ``seen`` as they were before it,
        ``up`` states above the line so far). ``record``: gets "point", (x, seen, up, supervisor state, step) before the
        first step the LQR balanced (the only steps the dither shapes: its phase matters from there on), if one did."""
        shadow, plant, dt = self.shadow, self.plant, self.dt
        l1, l2 = self._lengths
        lim0, lim1 = self.limits
        if seen is None:
            seen = deque([x], maxlen=self.delay_steps + 1)                # seen[0]: what the sensors report
        recording = record is not None
        for k in range(start, steps):
            if recording:
                point = (x, tuple(seen), up, shadow.capture_state(), k)
            reading = np.array(seen[0]) if noise is None else np.array(seen[0]) + noise[0][k]
            u = shadow.step(reading, t + k * dt)
            if recording and shadow.mode == "lqr":
                record["point"], recording = point, False
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
