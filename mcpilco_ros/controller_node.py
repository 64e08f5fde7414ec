"""controller_node: joint_states in, joint_commands out, through mcpilco_core's supervisor.

The node only translates: every valid state (rad, rad/s) goes to ``Supervisor.step(x, t)`` (the supervisor
holds the 50 Hz policy output itself; LQR and damping run on every state) and the torques (N m) go out on
``joint_commands`` stamped with the state they answer. Around that sit the safety rules a robot needs:

- disarmed (publishes nothing) until ``~/enable`` (std_srvs/SetBool) arms it; ``arm_on_start`` arms at start
  (simulation); disarming publishes one zero command so the driver stops at once;
- watchdog: no valid state for ``watchdog_timeout`` s -> one zero command, diagnostics ERROR, supervisor reset;
  it recovers (fresh time base, LQR/policy state forgotten) on the next valid state;
- a state marked ``frame_id: reset`` (inside a reset/disturbance window, or the state it hands over) resets the
  supervisor before its step: after a window the controller starts afresh, as the offline learner's does;
- bad states (names other than exactly shoulder/elbow, wrong lengths, NaN/inf, stamp going backwards) are
  counted, warned about (throttled) and never stepped, so they never reach the motors;
- ``~/reload_policy`` (std_srvs/Trigger) loads and validates the file the ``policy`` parameter names (or the
  newest ``*.npz`` in that directory) and swaps it in between two steps; a bad file keeps the old policy
  and the answer says why;
- exploration (trial 0 of MC-PILCO on the robot): with ``exploration.enabled`` (at start) or ``~/explore``
  (std_srvs/SetBool, only while disarmed) the actuated joint gets the learner's trial-0 exploration signal
  (:class:`mcpilco_core.control.exploration.ExplorationController`: uniform in +-``exploration.amplitude``
  N m, a new value every policy period, held in between; numpy only, this node never imports torch), the
  passive joint exactly 0, mode ``explore``. Each arming in
  exploration mode starts a new run whose numbers come from (``exploration.seed``, run index), exactly as the
  learner derives trial k's generator from (seed, k): reproducible, never the same twice in a session. The
  supervisor still watches every state: its ``damping`` (too fast) and ``safe`` modes override exploration.
  Switching exploration on the first time imports the learner (torch, ~2 s), which is why it is refused while armed;
- ``diagnostics``: mode, armed, watchdog, loop timing (state period, step compute; with the opt-in catch on, its
  plans' compute, solved after each command is published, and WARN when one took longer than its period), refused
  counts, policy,
  exploration.

The commanded JointState's ``header.frame_id`` carries the supervisor mode that produced it, so recordings
(bags, the simulated robot's trajectory) show which controller acted.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.duration import Duration
from rclpy.task import Future
from sensor_msgs.msg import JointState
from std_srvs.srv import SetBool, Trigger

from mcpilco_core.control import Supervisor, build_controller
from mcpilco_core.control.exploration import ExplorationController, exploration_command, trial_rng
from mcpilco_core.control.selection_workers import SelectionWorkerError
from mcpilco_core.paths import policies_dir
from mcpilco_core.policy import PolicyError, SumOfGaussiansPolicy, load_policy
from mcpilco_core.simulation import RESET_FRAME

from ._messages import CONTROL_QOS, command_message, stamp_ns, state_from_message
from ._ros_utils import ERROR, OK, WARN, ConfiguredNode, ParameterError, ParamSpec, RingStats, run_node

NODE_NAME = "controller_node"
REFUSAL_REASONS = ("names", "lengths", "nonfinite", "time_backwards", "time_jump")
# s: a state stamped this much further ahead than the wall time since the last accepted one is a glitch, not a
# measurement (accepted, it would make every correct state after it "time_backwards" until the watchdog trips). Above
# the protocol's hidden reset windows (0.2 s of simulated time stepped at once in lockstep) and any scheduling gap.
TIME_JUMP_LIMIT = 1.0
# s: how long the armed node's last zero command may wait on its way out for the subscribers' acknowledgement.
SHUTDOWN_ACK_TIMEOUT = 1.0

CONTROLLER_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("policy", "", "swing-up policy: a .npz/.np file, or a directory (its newest *.npz); '' = LQR + "
              "damping only. Relative paths: working directory, then the package's policies/. "
              "~/reload_policy re-reads it", read_only=False),
    ParamSpec("arm_on_start", False, "arm torque output at start (simulation only; on hardware call ~/enable)"),
    ParamSpec("watchdog_timeout", 0.05, "s without a valid joint_states message before zero torque and a "
              "diagnostics error", 0.001, 10.0),
    ParamSpec("warn_throttle", 1.0, "s, at most one warning about refused messages per this period", 0.0, 3600.0),
    ParamSpec("selection_wait_for_workers", False, "with the robot config's selection.workers: wait for a decision "
              "not ready when due (a lockstep simulation: the evaluator's numbers); false (a robot): drop it, the "
              "running policy goes on"),
    ParamSpec("exploration.enabled", False, "start in exploration mode (random torques, MC-PILCO trial 0); "
              "~/explore switches it while disarmed"),
    ParamSpec("exploration.amplitude", 3.0, "N m, exploration torques are uniform in +-amplitude (at most "
              "torque_limit)", 0.0, 50.0),
    ParamSpec("exploration.seed", 0, "seed of the exploration torques (run k uses (seed, k), like the learner's "
              "trial k)", 0, 2**31 - 1),
)

def resolve_policy_path(value: str) -> tuple[Path | None, str]:
    """The policy file a ``policy`` parameter names: (path or None, explanation).

    '' -> none (LQR + damping). A file -> that file. A directory -> its newest ``*.npz`` (what the trainer
    exports). Relative paths are tried against the working directory, then the package's policies dir.
    Raises ParameterError when the named file or directory does not exist.
    """
    value = value.strip()
    if not value:
        return None, "no policy configured: LQR + damping only"
    path = Path(value).expanduser()
    if not path.is_absolute() and not path.exists():
        candidate = policies_dir() / path
        if candidate.exists():
            path = candidate
    if path.is_dir():
        newest = sorted(path.glob("*.npz"), key=lambda p: (p.stat().st_mtime, p.name))
        if not newest:
            return None, f"policy directory {path} has no *.npz policy yet: LQR + damping only"
        return newest[-1], f"newest policy in {path}"
    if not path.exists():
        raise ParameterError(f"parameter 'policy': {value}: no such file or directory")
    return path, "policy file"


class ControllerNode(ConfiguredNode):
    """See the module docstring. Raises ParameterError (or ConfigError/PolicyError) on bad parameters."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, CONTROLLER_PARAMETERS, **kwargs)
        own = self.p
        self.watchdog_timeout = float(own["watchdog_timeout"])
        self.warn_throttle = float(own["warn_throttle"])

        policy, self.policy_path, note = self._load_policy_parameter(own["policy"])
        try:
            self.supervisor: Supervisor = build_controller(self.config, policy)
        except ValueError as exc:
            raise ParameterError(f"parameter 'policy': {exc}") from exc
        self.get_logger().info(f"{self.config.robot}: {note}; policy version {self.policy_version}; "
                               f"rho {self.supervisor.rho:.4g}")

        self.armed = False
        self.watchdog_tripped = False
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self.states_received = 0
        self.commands_published = 0
        self.step_time = RingStats()        # s, Supervisor.step compute time
        self.plan_time = RingStats()        # s, Supervisor.finish_step (the opt-in catch's plan or the selection's
                                            # share of a decision, after the command)
        self.state_period = RingStats()     # s, receipt interval of valid states
        self._last_stamp_ns: int | None = None
        self._base_ns: int | None = None    # stamp that maps to t = 0 for the supervisor
        self._answered_ns: int | None = None   # stamp of the last state the supervisor stepped, and its torques
        self._answer: np.ndarray | None = None
        self._last_state_rx = time.monotonic()
        self._last_mode = "idle"
        self._last_reload = ""
        self._reload_pending = False        # a ~/reload_policy load is running in its worker thread
        self.exploration_amplitude = float(own["exploration.amplitude"])
        self.exploration_seed = int(own["exploration.seed"])
        if self.exploration_amplitude > self.config.torque_limit:
            raise ParameterError(f"parameter 'exploration.amplitude': {self.exploration_amplitude} N m exceeds "
                                 f"torque_limit {self.config.torque_limit} N m")
        self.exploring = False
        self.exploration_runs = 0           # arming in exploration mode starts run k = this count
        self._explorer = None               # the ExplorationController of the current run
        if own["exploration.enabled"]:
            self._set_exploring(True)

        try:   # the opt-in selection's decisions on other cores; a decision late when due is dropped
            workers = self.supervisor.start_selection_workers(wait=bool(own["selection_wait_for_workers"]))
        except SelectionWorkerError as exc:
            raise ParameterError(f"parameter 'selection.workers': {exc}") from exc
        if workers:
            self.get_logger().info(f"policy selection: decisions computed in {workers} worker processes")
        self._late_reported = 0             # the selection's late decisions at the last diagnostics

        self.command_pub = self.create_publisher(JointState, "joint_commands", CONTROL_QOS)
        self.create_subscription(JointState, "joint_states", self._on_state, CONTROL_QOS)
        self.create_service(SetBool, "~/enable", self._on_enable)
        # its own callback group: while a reload loads in its worker thread, control goes on (and a second
        # request is answered "in progress" at once)
        self.create_service(Trigger, "~/reload_policy", self._on_reload,
                            callback_group=ReentrantCallbackGroup())
        self.create_service(SetBool, "~/explore", self._on_explore)
        self.create_timer(max(0.002, self.watchdog_timeout / 4.0), self._check_watchdog)
        if own["arm_on_start"]:
            self._arm(True)

    # ---------------------------------------------------------------- policy
    @property
    def policy_version(self) -> str:
        policy = self.supervisor.policy
        return policy.version() if isinstance(policy, SumOfGaussiansPolicy) else "none"

    def _load_policy_parameter(self, value: str) -> tuple[SumOfGaussiansPolicy | None, Path | None, str]:
        path, note = resolve_policy_path(value)
        if path is None:
            return None, None, note
        try:
            policy = load_policy(path, robot=self.config.robot, torque_limit=self.config.torque_limit,
                                 policy_period=self.config.policy_period)
        except PolicyError as exc:
            raise ParameterError(f"parameter 'policy': {exc}") from exc
        return policy, path, f"{note} {path}"

    def _load_in_worker(self, value: str, done: Future) -> None:
        """Resolve, read and validate the policy file (worker thread: never on the control path)."""
        try:
            path, note = resolve_policy_path(value)
            if path is None:
                raise PolicyError(note)
            policy = load_policy(path, robot=self.config.robot, torque_limit=self.config.torque_limit,
                                 policy_period=self.config.policy_period)
            done.set_result((policy, path))
        except BaseException as exc:  # noqa: BLE001 - handed to the service callback, which reports it
            done.set_exception(exc)

    async def _on_reload(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        """Load and validate the policy the parameter names in a worker thread while control goes on, then swap
        it in between two control steps (this coroutine resumes in the executor thread). Any failure keeps the
        running policy and the answer says why; the node never exits because of a policy file."""
        start = time.perf_counter()
        if self._reload_pending:
            response.success = False
            response.message = f"kept policy {self.policy_version}: a reload is already in progress"
            return response
        self._reload_pending = True
        done = Future()
        threading.Thread(target=self._load_in_worker, args=(str(self.get_parameter("policy").value), done),
                         name="policy_reload", daemon=True).start()
        try:
            policy, path = await done
        except Exception as exc:  # noqa: BLE001 - PolicyError, ParameterError, or anything a broken file provokes
            response.success = False
            response.message = f"kept policy {self.policy_version}: {exc}"
            self.get_logger().error(f"reload_policy refused: {response.message}")
        else:
            old = self.policy_version
            self.supervisor.set_policy(policy)
            self.policy_path = path
            response.success = True
            response.message = (f"loaded {path} (version {policy.version()}, was {old}) in "
                                f"{(time.perf_counter() - start) * 1e3:.1f} ms")
            self.get_logger().info(f"reload_policy: {response.message}")
        finally:
            self._reload_pending = False
        self._last_reload = response.message
        return response

    # ---------------------------------------------------------------- exploration
    def _set_exploring(self, on: bool) -> None:
        """Switch exploration on/off (numpy only: torch is never imported by this node)."""
        self.exploring = on
        self._explorer = None
        self.get_logger().info(f"exploration {'on' if on else 'off'}" + (
            f": +-{self.exploration_amplitude} N m, seed {self.exploration_seed}" if on else ""))

    def _start_exploration_run(self) -> None:
        """A new exploration signal: run k draws from the generator the learner uses for trial k."""
        rng = trial_rng(self.exploration_seed, self.exploration_runs)
        self._explorer = ExplorationController(self.config, self.exploration_amplitude, rng)
        self.exploration_runs += 1

    def _on_explore(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        if self.armed:
            response.success = False
            response.message = "refused while armed: disarm first (~/enable false)"
        else:
            self._set_exploring(bool(request.data))
            response.success = True
            response.message = ("exploration on (starts when armed)" if self.exploring
                                else "exploration off: the supervisor controls")
        return response

    # ---------------------------------------------------------------- arming
    def _reset_control(self) -> None:
        """Forget the supervisor's state and the time base (a new run, e.g. from a restarted driver)."""
        self.supervisor.reset()
        self._base_ns = None
        self._answered_ns, self._answer = None, None   # the last state stepped (stamp, ns) and its torques
        if self._explorer is not None:
            self._explorer.reset()

    def _arm(self, on: bool) -> None:
        if on and not self.armed:
            self._reset_control()
            self._last_stamp_ns = None  # a trial may come from a restarted driver with a new time base
            if self.exploring:
                self._start_exploration_run()
        if not on and self.armed:
            self._publish_zero()
        self.armed = on
        self.get_logger().info("armed: torque output on" if on else "disarmed: torque output off")

    def _on_enable(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        self._arm(bool(request.data))
        response.success = True
        response.message = "armed" if self.armed else "disarmed"
        if self.armed and self.watchdog_tripped:
            response.message += " (no fresh joint_states yet: commands start when they return)"
        return response

    def _publish_zero(self) -> None:
        self.command_pub.publish(command_message((0.0, 0.0), self.get_clock().now().to_msg(), "safe"))
        self.commands_published += 1

    # ---------------------------------------------------------------- the control step
    def _refuse(self, reason: str) -> None:
        self.refused[reason] += 1
        self.get_logger().warning(
            f"refused joint_states message ({reason}); refused so far: {self.refused}",
            throttle_duration_sec=self.warn_throttle)

    def _on_state(self, msg: JointState) -> None:
        rx = time.monotonic()
        x, reason = state_from_message(msg)
        if x is None:
            self._refuse(reason)
            return
        ns = stamp_ns(msg)
        if self._last_stamp_ns is not None and ns < self._last_stamp_ns:
            self._refuse("time_backwards")
            return
        if self._last_stamp_ns is not None and (ns - self._last_stamp_ns) * 1e-9 - (rx - self._last_state_rx) > \
                TIME_JUMP_LIMIT:
            self._refuse("time_jump")
            return
        self._last_stamp_ns = ns
        if self.states_received:
            self.state_period.add(rx - self._last_state_rx)
        self._last_state_rx = rx
        self.states_received += 1
        if self.watchdog_tripped:
            self.watchdog_tripped = False
            self.get_logger().info("joint_states are back: watchdog cleared")
        if not self.armed:
            return
        if ns == self._answered_ns and self._answer is not None:
            # the same state again (a lockstep simulator republishes a state whose answer it has not seen yet): the
            # same answer; a second step at the same time would restart the selection's decision, update the
            # observer twice and pace the policy's clock wrongly
            self.command_pub.publish(command_message(self._answer, msg.header.stamp, self._last_mode))
            self.commands_published += 1
            return
        if self._base_ns is None:
            self._base_ns = ns
        t = (ns - self._base_ns) * 1e-9
        start = time.perf_counter()
        if msg.header.frame_id == RESET_FRAME:
            # a reset/disturbance window (the driver runs it and ignores our answer) or the state it hands over:
            # the supervisor starts afresh there, as the offline learner's controller does after a window; what it
            # did during the window (an LQR try, a policy tick) must not shift its clocks after it
            self.supervisor.reset()
        u = self.supervisor.step(x, t)
        mode = self.supervisor.mode
        if self._explorer is not None:    # damping and safe override exploration (exploration_command)
            u, mode = exploration_command(u, mode, self._explorer, x, t)
        self.step_time.add(time.perf_counter() - start)
        if not np.isfinite(u).all():  # the supervisor guarantees this; a motor must never see NaN
            u = np.zeros(2)
        self._last_mode = mode
        self._answered_ns, self._answer = ns, u
        self.command_pub.publish(command_message(u, msg.header.stamp, self._last_mode))
        self.commands_published += 1
        if self.supervisor.plan_pending:    # the opt-in catch's next plan, or the selection's share, after the command
            start = time.perf_counter()
            self.supervisor.finish_step()
            self.plan_time.add(time.perf_counter() - start)

    def _check_watchdog(self) -> None:
        if self.watchdog_tripped or time.monotonic() - self._last_state_rx <= self.watchdog_timeout:
            return
        self.watchdog_tripped = True
        self._reset_control()
        self._last_stamp_ns = None  # a restarted driver may begin a new time base
        if self.armed:
            self._publish_zero()
        self._last_mode = "safe"
        if self.states_received:
            self.get_logger().error(f"no valid joint_states for {self.watchdog_timeout} s: zero torque")
        else:
            self.get_logger().warning("waiting for the first valid joint_states (zero torque until then)")
        self.publish_diagnostics()

    # ---------------------------------------------------------------- diagnostics
    def publish_diagnostics(self) -> None:
        if self.watchdog_tripped:
            level, message = ERROR, f"watchdog: no joint_states for more than {self.watchdog_timeout} s"
        elif not self.armed:
            level, message = WARN, "disarmed (call ~/enable)"
        elif self._last_mode == "safe":
            level, message = WARN, "mode safe"
        else:
            level, message = OK, f"mode {self._last_mode}"
        step = self.step_time.summary(1e6)
        plan = self.plan_time.summary(1e6)
        catch = self.config.catch
        if level == OK and catch.enabled and plan["max"] > catch.period * 1e6:   # a plan overran its period
            level, message = WARN, (f"a catch plan took {plan['max'] / 1e3:.1f} ms, longer than catch.period "
                                    f"({catch.period * 1e3:g} ms): the catch's plans are late on this computer")
        selection = self.supervisor.selection
        period_us = self.config.control_period * 1e6
        if level == OK and selection is not None and plan["max"] > period_us:   # a decision's share overran a step
            level, message = WARN, (f"a share of a policy selection's decision took {plan['max'] / 1e3:.1f} ms, longer "
                                    f"than the control period ({period_us / 1e3:g} ms): raise selection.lead or "
                                    f"selection.step, or shorten selection.horizon, for this computer")
        if selection is not None:
            late, self._late_reported = selection.late_decisions - self._late_reported, selection.late_decisions
            if level == OK and selection.failure:
                level, message = WARN, (f"the policy selection's workers failed: no more decisions, the running "
                                        f"policy goes on ({selection.failure.splitlines()[-1]})")
            elif level == OK and late > 0:
                level, message = WARN, (f"{late} of the policy selection's decisions were late or skipped since the "
                                        f"last report: more selection.workers (cores), or raise selection.lead")
        period = self.state_period.summary(1e3)
        values = {"mode": self._last_mode, "armed": self.armed, "watchdog_tripped": self.watchdog_tripped,
                  "friction_compensation": self.config.friction_compensation.enabled,
                  "observer": self.config.observer.enabled,
                  "catch": catch.enabled, "catching": self.supervisor.catching,
                  "selection": selection is not None, "selected_candidate": self.supervisor.selected,
                  "selected_dither_offset_s": self.supervisor.dither_offset,
                  "selection_decisions": selection.decisions if selection is not None else 0,
                  "selection_workers": selection.worker_count if selection is not None else 0,
                  "selection_late_decisions": selection.late_decisions if selection is not None else 0,
                  "selection_failure": selection.failure if selection is not None else "",
                  "policy_version": self.policy_version, "policy_path": str(self.policy_path or ""),
                  "rho": self.supervisor.rho, "states_received": self.states_received,
                  "commands_published": self.commands_published,
                  "step_compute_p50_us": step["p50"], "step_compute_p99_us": step["p99"],
                  "step_compute_max_us": step["max"], "plan_compute_p50_us": plan["p50"],
                  "plan_compute_max_us": plan["max"], "state_period_mean_ms": period["mean"],
                  "state_period_p99_ms": period["p99"], "state_period_max_ms": period["max"],
                  "last_reload": self._last_reload, "exploring": self.exploring,
                  "exploration_amplitude": self.exploration_amplitude, "exploration_seed": self.exploration_seed,
                  "exploration_runs": self.exploration_runs}
        values.update({f"refused_{k}": v for k, v in self.refused.items()})
        self.publish_status("controller", level, message, values)

    def destroy_node(self) -> None:
        """Stop the opt-in selection's worker processes with the node."""
        supervisor = getattr(self, "supervisor", None)     # absent when the parameters were refused
        if supervisor is not None:
            supervisor.close()
        super().destroy_node()

    def on_shutdown(self) -> None:
        """A zero command on the way out when armed, and held until the driver has it.

        Why wait: the process exits right after, and a reliable DDS writer destroyed with the sample still unsent
        drops it (CI saw the driver never get it). Up to ``SHUTDOWN_ACK_TIMEOUT`` s for every subscriber's ack; the
        driver's command_timeout remains the backstop when none comes.
        """
        if not self.armed:
            return
        self._publish_zero()
        if not self.command_pub.wait_for_all_acked(Duration(seconds=SHUTDOWN_ACK_TIMEOUT)):
            self.get_logger().warning(f"the zero command on the way out was not acknowledged within "
                                      f"{SHUTDOWN_ACK_TIMEOUT} s; the driver zeroes the torque at its command_timeout")


def main(args: list[str] | None = None) -> int:
    """Console script ``controller_node``; exits 2 with the reason when its parameters are invalid."""
    return run_node(ControllerNode, NODE_NAME, args)


if __name__ == "__main__":
    raise SystemExit(main())
