"""sim_driver_node: the simulated robot, with the moteus driver's interface.

Publishes ``joint_states`` (names shoulder/elbow; rad, rad/s, and the torque applied over the last step in
N m), takes ``joint_commands`` (effort, N m), offers ``~/stop`` (std_srvs/Trigger, latched zero torque) and
integrates ``mcpilco_core``'s plant with RK4 at ``control_period`` (2 ms). Like the hardware driver it never
trusts a command: the actuated joint is clipped to ``torque_limit``, the passive joint always gets exactly 0,
and commands older than ``command_timeout`` count as stale (zero torque).

Two clocks:

- ``realtime``: a wall-clock timer at 1/control_period (500 Hz) steps with the newest fresh command and
  publishes the new state stamped with the ROS clock. What a real robot does, including its latency.
- ``lockstep``: deterministic. State k is stamped with simulated time k * control_period; the simulation
  advances exactly one step when the command answering state k arrives (matched by stamp). Before the first
  answer, and whenever an answer is late (a lost message), it re-publishes the current state every 50 ms;
  only no answer within ``lockstep_timeout`` s of wall time steps with zero torque (counted). With the
  protocol enabled this is the same computation as ``mcpilco evaluate`` (``mcpilco_core.evaluation``), only over ROS.

``robot_profile`` chooses the simulated robot (``config/robot_profiles.yaml``: plant model, sensor noise and delay,
motor lag and noise; default ``nominal``, the robot config's plant with ideal sensors and motors); joint_states carry
what its sensors measure. Its noise is seeded by ``protocol.seed``, so a profile and a seed give the numbers of
``mcpilco evaluate --robot-profile``.

``protocol.enabled`` runs the evaluation protocol's disturbance schedule for ``protocol.seed``
(``ResetPerturbation``: PID + gravity compensation on both joints for 0.2 s windows, limited to 6 N m;
the controller is not told, it keeps receiving states; ``protocol.publish_during_resets: false`` hides the
windows from it instead, which is exactly the evaluator's computation). ``duration`` > 0 ends the run after that much
simulated time: the score is logged and, with ``record_file``, the trajectory (t, x, u, u_cmd, mode codes,
disturbance windows, score) is written as .npz. The state at ``duration`` is published as well (the end of the last
interval: a recorded trial of T s holds T / 0.02 intervals, as the offline learner's); ``exit_when_done`` then ends
the process, in lockstep once that final state is answered (proof it went out) or after 1 s.

``~/disturb`` (std_srvs/Trigger) starts one *disturbance window* (a disturbance trial's start, DESIGN.md sections 5
and 8): from the current step, the protocol's reset PID (``mcpilco_core.evaluation.DisturbanceWindow``: Kp 10,
Ki 0.1, Kd 1 with the PID's 1 ms dt, plus gravity compensation) drives both joints for 0.2 s (100 steps of 2 ms)
towards a random target (``disturbance.seed``: window n uses the n-th draw of ``DisturbanceTargets``), bounded
on both joints by ``disturbance.torque_limit`` (<= 6 N m, the protocol's). Commands are ignored meanwhile;
outside the window the passive joint gets exactly 0 as always. The answer's message is JSON (window index,
target rad, seed, torque limit, start step); diagnostics name the window while it runs. Refused while one runs,
after ``~/stop``, or with ``protocol.enabled`` (the protocol runs its own windows). A window's steps do not
count towards ``duration``: the run lasts ``duration`` s after it, as a disturbance trial of the learner does.

Every ``joint_states`` message measured inside a window (reset PID or protocol reset: the torque applied over
the step before it or the step after it comes from the PID) has ``header.frame_id = "reset"`` (else ""):
the recording reader never gives those intervals to the model (the passive joint is torqued there).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
from builtin_interfaces.msg import Time
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger

from mcpilco_core.config import JOINT_NAMES, ConfigError
from mcpilco_core.evaluation import (
    RESET_TORQUE_LIMIT,
    DisturbanceSchedule,
    DisturbanceTargets,
    DisturbanceWindow,
    ResetPerturbation,
)
from mcpilco_core.plant import DoublePendulum
from mcpilco_core.simulation import RESET_FRAME, load_robot_profile

from ._messages import CONTROL_QOS, effort_from_message, stamp_ns
from ._ros_utils import ERROR, OK, WARN, ConfiguredNode, ParameterError, ParamSpec, RingStats, run_node

NODE_NAME = "sim_driver_node"
MODES = ("realtime", "lockstep")
WAITING_REPUBLISH_PERIOD = 0.05  # s: lockstep re-publishes an unanswered state this often
FINAL_STATE_WAIT = 1.0           # s: lockstep waits this long for the answer to the final state before exiting

SIM_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("mode", "realtime", "realtime (wall-clock timer at 1/control_period) or lockstep (one step per "
              "command answering the latest state; deterministic)", choices=MODES),
    ParamSpec("initial_state", [0.0, 0.0, 0.0, 0.0], "initial state q1, q2 (rad), dq1, dq2 (rad/s)", length=4),
    ParamSpec("command_timeout", 0.02, "s, commands older than this are stale: zero torque", 0.001, 10.0),
    ParamSpec("lockstep_timeout", 0.1, "s of wall time to wait for the answer to a state (lockstep) before "
              "stepping with zero torque", 0.001, 60.0),
    ParamSpec("robot_profile", "nominal", "the simulated robot: a profile of config/robot_profiles.yaml (nominal, "
              "hardware_proxy, hardware_proxy_nonoise, perturbed), NAME:SEED, or a profile YAML file; its noise is "
              "seeded by protocol.seed"),
    ParamSpec("protocol.enabled", False, "run the evaluation protocol's disturbance schedule"),
    ParamSpec("protocol.seed", 0, "seed of the disturbance schedule and of the robot profile's noise", 0,
              2**32 - 1),
    ParamSpec("protocol.publish_during_resets", True, "publish joint_states during the disturbance windows (the "
              "controller keeps seeing the robot, as on hardware); false = the evaluator's exact computation, in "
              "which the controller is not called during a window"),
    ParamSpec("disturbance.torque_limit", RESET_TORQUE_LIMIT, "N m on both joints during a ~/disturb window "
              "(the protocol's reset PID); 0 refuses ~/disturb", 0.0, RESET_TORQUE_LIMIT),
    ParamSpec("disturbance.seed", 0, "seed of the ~/disturb windows' random targets", 0, 2**32 - 1),
    ParamSpec("duration", 0.0, "s of simulated time (not counting ~/disturb windows), then stop (0 = until "
              "stopped)", 0.0, 1e7),
    ParamSpec("record_file", "", ".npz file for the trajectory at the end of duration ('' = none)"),
    ParamSpec("exit_when_done", False, "end the process when duration is over"),
)


class SimDriverNode(ConfiguredNode):
    """See the module docstring. Raises ParameterError on bad parameters."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, SIM_PARAMETERS, **kwargs)
        own = self.p
        self.mode = str(own["mode"])
        x0 = [float(v) for v in own["initial_state"]]
        self.plant = DoublePendulum(self.config.plant)
        self.dt = float(self.config.control_period)
        self._dt_ns = int(round(self.dt * 1e9))
        self.limits = self.config.torque_limits
        self.command_timeout = float(own["command_timeout"])
        self.lockstep_timeout = float(own["lockstep_timeout"])
        self.seed = int(own["protocol.seed"])
        self.perturbation = (ResetPerturbation(DisturbanceSchedule.from_seed(self.seed), self.plant, self.dt)
                             if own["protocol.enabled"] else None)
        self.publish_during_resets = bool(own["protocol.publish_during_resets"])
        self.disturbance_limit = float(own["disturbance.torque_limit"])
        self.targets = DisturbanceTargets(int(own["disturbance.seed"]))
        self.window: DisturbanceWindow | None = None     # the newest ~/disturb window
        self.windows: list[dict] = []                    # every ~/disturb window: index, target, start/end step
        self._window_steps = 0                           # steps run inside ~/disturb windows (beyond duration)
        self._last_step_reset = False                    # the step that led to the current state was a window's
        self.duration = float(own["duration"])
        self.record_file = str(own["record_file"])
        self.exit_when_done = bool(own["exit_when_done"])

        self.finished = False
        self._exit_at: float | None = None     # lockstep with exit_when_done: exit by then at the latest
        self.started = self.mode == "realtime"
        self.counters = {"refused_names": 0, "refused_lengths": 0, "refused_nonfinite": 0, "stale_steps": 0,
                         "unmatched_commands": 0, "lockstep_timeouts": 0, "republished": 0, "commands": 0}
        self._command = (0.0, 0.0)
        self._command_mode = "other"
        self._command_rx: float | None = None
        self._published_ns = 0
        self._first_publish = 0.0   # monotonic time state k was first published
        self._last_publish = time.monotonic()
        self._last_tick: float | None = None
        self.tick_period = RingStats(5000)   # s between realtime steps
        self.score: float | None = None
        n = int(round(self.duration / self.dt)) if self.duration > 0 else 0
        self._n_steps = n
        self._record = self.record_file != "" and n > 0
        # The simulated robot itself (mcpilco_core.simulation); this node adds only clocks and messages.
        try:
            self.profile = load_robot_profile(str(own["robot_profile"]))
        except ConfigError as exc:
            raise ParameterError(f"parameter 'robot_profile': {exc}") from exc
        limit = RESET_TORQUE_LIMIT if self.perturbation is not None else self.disturbance_limit
        self.robot = self.profile.robot(self.config, self.seed, x0, override=self._override,
                                        override_limits=(limit, limit), record=self._record)

        self.state_pub = self.create_publisher(JointState, "joint_states", CONTROL_QOS)
        self.create_subscription(JointState, "joint_commands", self._on_command, CONTROL_QOS)
        self.create_service(Trigger, "~/stop", self._on_stop)
        self.create_service(Trigger, "~/disturb", self._on_disturb)
        if self.mode == "realtime":
            self.create_timer(self.dt, self._tick)
        else:
            self.create_timer(WAITING_REPUBLISH_PERIOD / 2.0, self._lockstep_watch)
        protocol = f"protocol seed {self.seed}" if self.perturbation else "no disturbances"
        self.get_logger().info(f"{self.config.robot}, robot profile {self.profile.label} "
                               f"({self.robot.plant.params.name}), {self.mode}, dt {self.dt} s, "
                               f"limits {self.limits} N m, {protocol}")
        self._publish_state()

    # ---------------------------------------------------------------- simulation
    @property
    def k(self) -> int:
        """Index of the current step."""
        return self.robot.k

    @property
    def stopped(self) -> bool:
        return self.robot.stopped

    def _override(self, k: int, t: float, x: tuple):
        """The robot's override: the evaluation protocol's resets, or a ~/disturb window (never both)."""
        if self.perturbation is not None:
            return self.perturbation(k, t, x)
        if self.window is None:
            return None
        u = self.window(k, t, x)
        if u is None and self.window.finished and self.windows[-1]["end_step"] is None:
            self.windows[-1]["end_step"] = k
            self.get_logger().info(f"disturbance window {self.windows[-1]['index']} over after "
                                   f"{self.window.steps} steps")
        return u

    def _advance(self, command: tuple[float, float], mode: str) -> None:
        """One step of the simulated robot with ``command`` (N m; the robot applies limits, resets, stop)."""
        reset = self.robot.in_override() and not self.robot.stopped
        disturbance = reset and self.perturbation is None
        self.robot.step(command, mode)
        self._last_step_reset = reset
        if disturbance and self._n_steps:
            self._window_steps += 1
            self._n_steps += 1          # a window's steps come on top of duration
        if self._n_steps and self.robot.k >= self._n_steps:
            self._finish()

    def _hidden_by_reset(self) -> bool:
        return not self.publish_during_resets and self.robot.in_override()

    def _skip_resets(self) -> None:
        """Without publishing during resets: run the window's steps now, without the controller."""
        while not self.finished and self._hidden_by_reset():
            self._advance((0.0, 0.0), "reset")

    def _fresh_command(self, now: float) -> tuple[tuple[float, float], str]:
        if self._command_rx is None or now - self._command_rx > self.command_timeout:
            if self._command_rx is not None:
                self.counters["stale_steps"] += 1
            return (0.0, 0.0), "safe"
        return self._command, self._command_mode

    def _tick(self) -> None:
        """Realtime: step with the newest fresh command, then publish the new state."""
        now = time.monotonic()
        if self._last_tick is not None:
            self.tick_period.add(now - self._last_tick)
        self._last_tick = now
        if self.finished:
            return
        self._advance(*self._fresh_command(now))
        if not self.finished and not self._hidden_by_reset():
            self._publish_state()

    def _lockstep_watch(self) -> None:
        """Lockstep: re-publish the current state every 50 ms until it is answered (before the first answer,
        and when a message was lost: the controller answers a repeated state with the same torque); only after
        ``lockstep_timeout`` s without an answer step with zero torque (counted)."""
        now = time.monotonic()
        if self.finished:
            if self._exit_at is not None and now > self._exit_at:
                self.done.set()          # the final state went out unanswered: exit anyway
            return
        if now - self._last_publish <= WAITING_REPUBLISH_PERIOD:
            return
        if self.started and now - self._first_publish > self.lockstep_timeout:
            self.counters["lockstep_timeouts"] += 1
            self._advance((0.0, 0.0), "safe")
            self._skip_resets()
            if self.finished:
                return
        elif self.started:
            self.counters["republished"] += 1
        self._publish_state()

    def _publish_state(self) -> None:
        msg = JointState()
        if self.mode == "lockstep":
            ns = self.k * self._dt_ns
            msg.header.stamp = Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)
        else:
            msg.header.stamp = self.get_clock().now().to_msg()
            ns = stamp_ns(msg)
        msg.name = list(JOINT_NAMES)
        if self._last_step_reset or (self.robot.in_override() and not self.robot.stopped):
            msg.header.frame_id = RESET_FRAME
        q1, q2, dq1, dq2 = self.robot.measurement()
        msg.position = [float(q1), float(q2)]
        msg.velocity = [float(dq1), float(dq2)]
        msg.effort = [float(self.robot.applied[0]), float(self.robot.applied[1])]
        if ns != self._published_ns or self._first_publish == 0.0:
            self._first_publish = time.monotonic()
        self._published_ns = ns
        self._last_publish = time.monotonic()
        self.state_pub.publish(msg)

    # ---------------------------------------------------------------- interfaces
    def _on_command(self, msg: JointState) -> None:
        u, reason = effort_from_message(msg)
        if u is None:
            self.counters[f"refused_{reason}"] += 1
            self.get_logger().warning(f"refused joint_commands message ({reason})", throttle_duration_sec=1.0)
            return
        self.counters["commands"] += 1
        if self.mode == "realtime":
            self._command, self._command_mode, self._command_rx = u, msg.header.frame_id, time.monotonic()
            return
        if self.finished and stamp_ns(msg) == self._published_ns:
            if self._exit_at is not None:
                self.done.set()          # the final state was received: exit now
            return                       # the answer to the final state moves nothing
        if self.finished or stamp_ns(msg) != self._published_ns:
            self.counters["unmatched_commands"] += 1
            return
        self.started = True
        self._advance(u, msg.header.frame_id)
        self._skip_resets()
        if not self.finished:
            self._publish_state()

    def _on_stop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.robot.stopped = True
        self.get_logger().warning("stop requested: zero torque until the node restarts")
        response.success = True
        response.message = "stopped: zero torque on both joints (latched until restart)"
        return response

    def _on_disturb(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.start_disturbance()
        self.get_logger().info(f"~/disturb: {response.message}")
        return response

    def start_disturbance(self) -> tuple[bool, str]:
        """Start a disturbance window at the current step (module docstring); (accepted, JSON or reason)."""
        if self.perturbation is not None:
            return False, "refused: protocol.enabled runs the evaluation protocol's own reset windows"
        if self.disturbance_limit <= 0.0:
            return False, "refused: disturbance.torque_limit is 0"
        if self.stopped or self.finished:
            return False, f"refused: the simulated robot is {'stopped' if self.stopped else 'finished'}"
        if self._window_armed():
            return False, f"refused: disturbance window {self.windows[-1]['index']} is still running"
        target = self.targets.next()
        self.window = DisturbanceWindow(target, self.plant, self.dt, start=self.k)
        self.robot.rearm_override()      # the current step's (idle) override may have been asked already
        info = {"index": len(self.windows), "target": [float(v) for v in target], "seed": self.targets.seed,
                "torque_limit": self.disturbance_limit, "start_step": self.k, "start_time_s": self.k * self.dt,
                "end_step": None}
        self.windows.append(info)
        self.publish_diagnostics()      # the window in diagnostics at once: the trainer's fallback if an answer is lost
        return True, self._window_answer(info)

    @staticmethod
    def _window_answer(info: dict) -> str:
        """The ~/disturb answer for a window (also ``disturbance_last`` in diagnostics)."""
        return json.dumps({k: v for k, v in info.items() if k != "end_step"})

    def _finish(self) -> None:
        self.finished = True
        publish_final = not self._hidden_by_reset()
        if self._record:
            traj = self.robot.finish(self.duration + self._window_steps * self.dt)
            self.score = traj.score
            windows = np.array(self.perturbation.windows if self.perturbation else np.zeros((0, 2)))
            path = Path(self.record_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, t=traj.t, x=traj.x, u=traj.u, u_cmd=traj.u_cmd, mode=traj.mode,
                     x_measured=traj.extras["x_measured"],
                     windows=windows.reshape(-1, 2), score=self.score, seed=self.seed,
                     robot=self.config.robot, robot_profile=self.profile.label,
                     disturbance_windows=np.array([[w["start_step"], w["end_step"] if w["end_step"] is not None
                                                    else self.k] for w in self.windows], dtype=np.int64).reshape(-1, 2),
                     disturbance_targets=np.array([w["target"] for w in self.windows]).reshape(-1, 2),
                     lockstep_timeouts=self.counters["lockstep_timeouts"],
                     # the stamp (ns) of the final state, published below; -1: none, or stamped by the clock
                     final_state_stamp_ns=self.k * self._dt_ns if publish_final and self.mode == "lockstep" else -1,
                     stale_steps=self.counters["stale_steps"], republished=self.counters["republished"])
            self.get_logger().info(f"done after {self.duration} s: score {self.score:.4f}, trajectory {path}")
        else:
            self.get_logger().info(f"done after {self.duration} s")
        self.publish_diagnostics()
        if publish_final:
            self._publish_state()        # the state at duration: the end of the last interval
        if self.exit_when_done:
            if self.mode == "lockstep":
                self._exit_at = time.monotonic() + FINAL_STATE_WAIT
            else:
                self.done.set()

    def _window_armed(self) -> bool:
        """A ~/disturb window was started and is not over."""
        return self.window is not None and not self.window.finished and not self.robot.stopped

    def publish_diagnostics(self) -> None:
        period = self.tick_period.summary(1e3)
        if self.stopped:
            level, message = ERROR, "stopped (~/stop)"
        elif self.finished:
            level, message = OK, f"finished: score {self.score}" if self.score is not None else "finished"
        elif self._window_armed():
            level, message = OK, (f"disturbance window {self.windows[-1]['index']} towards "
                                  f"{[round(v, 4) for v in self.windows[-1]['target']]} rad")
        elif self.mode == "lockstep" and not self.started:
            level, message = WARN, "lockstep: waiting for the first command"
        else:
            level, message = OK, f"running ({self.mode})"
        values = {"mode": self.mode, "step": self.k, "sim_time_s": self.k * self.dt, "stopped": self.stopped,
                  "applied_torque": list(self.robot.applied),
                  "rate_hz": 1e3 / period["mean"] if period["mean"] == period["mean"] else math.nan,
                  "period_p50_ms": period["p50"], "period_p99_ms": period["p99"], "period_max_ms": period["max"]}
        last = self.windows[-1] if self.windows else None
        values.update({"disturbance_active": self._window_armed(),
                       "disturbance_windows": len(self.windows), "disturbance_seed": self.targets.seed,
                       "disturbance_torque_limit": self.disturbance_limit,
                       "disturbance_target": last["target"] if last else [],
                       "disturbance_last": self._window_answer(last) if last else "",
                       "disturbance_steps": self.window.steps if self.window is not None else 0})
        values.update(self.counters)
        self.publish_status("simulated robot", level, message, values)


def main(args: list[str] | None = None) -> int:
    """Console script ``sim_driver_node``; exits 2 with the reason when its parameters are invalid."""
    return run_node(SimDriverNode, NODE_NAME, args)


if __name__ == "__main__":
    raise SystemExit(main())
