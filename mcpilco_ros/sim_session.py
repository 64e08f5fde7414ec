"""``mcpilco session --robot pendubot --sim --trials K --out runs/NAME``: the hardware loop, simulated robot.

What a team does on the robot (docs/sessions.md), run end to end over ROS against ``sim_driver_node``:

1. ``controller_node`` (no policy, exploration on) and ``trainer_node`` start as subprocesses with the same
   ``--ros-args --params-file`` files the launch files use (robot file, ``config/trainer.yaml``) plus this run's
   ``params.yaml``, exactly as ``mcpilco demo`` starts its nodes;
2. trial k: a fresh ``sim_driver_node`` (lockstep: deterministic and immune to a busy machine; at rest, or at the
   learner's initial state of trial k; the simulated robot of ``--robot-profile``, default the training config's
   ``robot_profile``, its noise seeded per trial as the learner's) is started, ``~/start_trial`` records it,
   ``~/enable`` arms the controller, the robot runs ``exploration.duration`` (trial 0, random torques) or
   ``trial_duration`` s and exits, ``~/stop_trial`` closes the bag, the controller is disarmed. From trial
   ``--disturbance-from K`` on (default the training config's ``initial_state.disturbance_trial_from``; 0 = never)
   a trial is a *disturbance trial*: ``~/start_disturbance_trial`` makes the trainer call the driver's ``~/disturb``
   once the recording runs, and the trial begins with the protocol's 0.2 s reset PID window on both motors
   towards a random target (then ``trial_duration`` s of the policy);
3. between trials ``~/retrain`` fits the GP model and optimises the policy from every bag so far in the
   trainer's separate process, which exports ``policy_NNN_<version>.npz`` and hot-reloads it into the
   controller (``policy`` parameter + ``~/reload_policy``); the session waits until the controller reports the
   new version, and meanwhile scores the previous trial's policy with the evaluation protocol;
4. at the end: ``learning_curve.png`` (cost of each recorded trial and evaluation score of each trial's policy,
   against robot seconds), ``session.json`` and the final policy's score (``mcpilco_core.evaluation.evaluate_seeds``
   on the same robot profile).

Robot time (DESIGN.md section 8): every second the robot ran for learning -- exploration, trials and their
disturbance windows, i.e. every simulated step of every trial -- is counted per trial (``robot_time_s``) and in
total in session.json (``robot_time_s``, with ``robot_time_breakdown_s``); the evaluation runs only score each
policy for the report (nothing of them feeds the learner or any choice) and are reported apart
(``evaluation_time_s``, not counted).

Output directory::

    runs/NAME/session/          trainer's session: trial_NNN/ bags + session.yaml
    runs/NAME/retrain/          trainer's run dir: policies/policy_NNN_<version>.npz, models/, retrain.json, logs
    runs/NAME/logs/             one log per node process; logs/ros/: ROS's own logs (unless ROS_LOG_DIR is set)
    runs/NAME/params/           the params files given to the nodes
    runs/NAME/trials/           the simulated robot's trajectory of each trial (.npz)
    runs/NAME/policy.npz        the final policy;   session.json, learning_curve.png

Every node process is stopped (SIGINT, then SIGKILL) on every exit path, Ctrl-C and SIGTERM included. rclpy is
imported only when a session runs, so ``mcpilco_ros.cli`` may register this module freely.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mcpilco_core.config import ConfigError
from mcpilco_core.learning.cli import tolerance_arg

from .demo import ROBOTS, node_command, ros_environment, stop_process, write_overrides

ROS_ENV_KEYS = ("ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOCALHOST_ONLY", "ROS_DOMAIN_ID", "ROS_LOG_DIR",
                "AMENT_PREFIX_PATH")
LOCKSTEP_TIMEOUT = 5.0      # s of wall time before the simulated robot steps without an answer (busy machine)
WATCHDOG_TIMEOUT = 5.0      # s, the controller's: lockstep time is simulated, the wall clock may lag
POLL = 0.02                 # s between checks of a condition
FINAL_STATE_TIMEOUT = 5.0   # s to wait for the trainer to record a trial's final state before the bag is closed


class InterruptGuard:
    """SIGINT/SIGTERM -> KeyboardInterrupt, except inside :meth:`critical`, where it waits until the section ends.

    Why: an interrupt inside ``subprocess.Popen`` (after the fork, before it returns) would leave a node process
    nobody knows about; one inside the shutdown would abandon the nodes not yet stopped.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.depth = 0
        self.pending = False
        self._previous: dict = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.depth:
            self.pending = True
        else:
            raise KeyboardInterrupt

    def install(self) -> None:
        """Take over the signals (main thread only; elsewhere Python cannot install handlers)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handler) for sig in self.SIGNALS}

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    @contextmanager
    def critical(self, reraise: bool = True) -> Iterator[None]:
        """No KeyboardInterrupt inside; a signal that came meanwhile raises it at the end (if ``reraise``)."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending:
                self.pending = False
                if reraise:
                    raise KeyboardInterrupt


class SessionError(RuntimeError):
    """The session cannot go on (a node died, a retrain failed, a timeout); the message says where to look."""


@dataclass
class SessionOptions:
    """One ``mcpilco session`` run. Durations in s; ``eval_seeds`` empty = the training config's (or 100)."""

    robot: str
    train_config: Path
    out: Path
    trials: int | None = None
    eval_seeds: tuple[int, ...] = ()
    eval_duration: float = 60.0
    eval_jobs: int = 1
    startup_timeout: float = 120.0
    trial_timeout: float = 600.0
    retrain_timeout: float = 7200.0
    notes: str = ""
    quiet: bool = False
    robot_profile: str | None = None          # the simulated robot (None: the training config's robot_profile)
    disturbance_from: int | None = None       # trials >= K begin with a disturbance window (0 = never; None: the
                                              # training config's initial_state.disturbance_trial_from)
    check: int = 0                            # > 0: the final policy is chosen by a robot check of the best-ranked
                                              # `check` policies (mcpilco select --check; counted robot time)
    check_seconds: float = 20.0               # s of the protocol per checked policy
    check_seed: int = 1000                    # seed of the check's disturbance schedule
    check_tolerance: float | None = 0.15     # the check stops at the first candidate the robot confirms (None: all)
    rank: str = "protocol"                    # the choice's ranking: "protocol" on the model's plant, or "cost"
    protocol_seconds: float = 60.0            # s of the protocol on the model per seed (no robot time)


@dataclass
class TrialRow:
    """One line of the learning curve (session.json)."""

    trial: int
    mode: str
    policy: str
    policy_version: str
    x0: list[float]
    duration_s: float
    messages: dict[str, int]    # recorded per topic
    transitions: int            # at the policy period, usable by the learner
    cost: float                 # mean saturated cost per state at the policy period, in [0, 1)
    cost_sum: float             # its sum over the trial (the learner's robot_cost)
    eval_score: float | None = None
    eval_scores: list[float] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    robot_time_s: float = 0.0                 # s the robot ran in this trial (window included): counted
    window_s: float = 0.0                     # of which the disturbance window
    disturbance: dict | None = None           # the driver's answer (window index, target rad, seed, torque limit)
    eval_time_s: float = 0.0                  # s of evaluation runs scoring this trial's policy: reported apart


# --------------------------------------------------------------------------------------------------
# Node processes


class NodeProcesses:
    """Node subprocesses with their logs; :meth:`stop_all` ends every one (newest first)."""

    def __init__(self, log_dir: Path, env: dict[str, str], guard: InterruptGuard | None = None) -> None:
        self.log_dir, self.env = log_dir, env
        self.guard = guard or InterruptGuard()
        self.procs: dict[str, subprocess.Popen] = {}
        self.started: list[subprocess.Popen] = []     # every process ever started (tests check they all ended)
        self._logs: list[Any] = []

    def start(self, name: str, module: str, params: list[Path]) -> subprocess.Popen:
        with self.guard.critical():   # registered before an interrupt can leave it unknown
            log = open(self.log_dir / f"{name}.log", "wb")
            self._logs.append(log)
            proc = subprocess.Popen(node_command(module, params), env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT)
            self.procs[name] = proc
            self.started.append(proc)
        return proc

    def check_alive(self, names: tuple[str, ...]) -> None:
        for name in names:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise SessionError(f"{name} exited with code {proc.returncode}: {self.tail(name)}")

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines() if path.is_file() else []
        return f"see {path}" + ("\n  " + "\n  ".join(text[-lines:]) if text else "")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_process(proc)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)
        for log in self._logs:
            log.close()
        self._logs.clear()


# --------------------------------------------------------------------------------------------------
# The session's own ROS node: service calls and the nodes' diagnostics


class RosClient:
    """A node in its own rclpy context, spun by a SingleThreadedExecutor in a background thread."""

    def __init__(self, nodes: NodeProcesses, watched: tuple[str, ...]) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from std_srvs.srv import SetBool, Trigger

        self.nodes, self.watched = nodes, watched
        self.context = rclpy.Context()
        rclpy.init(context=self.context, signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
        self.node = rclpy.create_node("mcpilco_session", context=self.context)
        self.status: dict[str, dict[str, str]] = {}
        self.node.create_subscription(DiagnosticArray, "diagnostics", self._on_diagnostics, 50)
        self.enable = self.node.create_client(SetBool, "/controller_node/enable")
        self.explore = self.node.create_client(SetBool, "/controller_node/explore")
        self.start_trial = self.node.create_client(Trigger, "/trainer_node/start_trial")
        self.start_disturbance_trial = self.node.create_client(Trigger, "/trainer_node/start_disturbance_trial")
        self.stop_trial = self.node.create_client(Trigger, "/trainer_node/stop_trial")
        self.retrain = self.node.create_client(Trigger, "/trainer_node/retrain")
        self.SetBool, self.Trigger = SetBool, Trigger
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def _on_diagnostics(self, msg) -> None:
        for st in msg.status:
            key = st.name.split(":")[0]   # "controller_node: controller" -> controller_node
            self.status[key] = {kv.key: kv.value for kv in st.values} | {"_message": st.message}

    def value(self, node: str, key: str, default: str = "") -> str:
        return self.status.get(node, {}).get(key, default)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``predicate``; raise SessionError naming ``what`` after ``timeout`` s or when a node died."""
        end = time.monotonic() + timeout
        while not predicate():
            self.nodes.check_alive(self.watched)
            if time.monotonic() > end:
                raise SessionError(f"{what}: not reached within {timeout:g} s")
            time.sleep(POLL)

    def call(self, client, request, timeout: float = 30.0, what: str = ""):
        """Call a service; raise SessionError if it is unavailable, does not answer, or answers failure."""
        what = what or client.srv_name
        self.wait(client.service_is_ready, timeout, f"service {client.srv_name} available")
        future = client.call_async(request)
        self.wait(future.done, timeout, f"answer of {client.srv_name}")
        answer = future.result()
        if answer is None or not answer.success:
            raise SessionError(f"{what}: {answer.message if answer else 'no answer'}")
        return answer

    def trigger(self, client, what: str = "", timeout: float = 30.0) -> str:
        return self.call(client, self.Trigger.Request(), timeout, what).message

    def set_bool(self, client, value: bool, what: str = "") -> str:
        return self.call(client, self.SetBool.Request(data=value), what=what).message

    def close(self) -> None:
        """Stop and join the spin thread, then shut the executor and the context down."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


# --------------------------------------------------------------------------------------------------
# The session


class SimSession:
    """One run of :func:`run_session` (see the module docstring); call :meth:`run` once."""

    def __init__(self, options: SessionOptions) -> None:
        from mcpilco_core.learning.learner import load_train_config

        self.o = options
        self.cfg = load_train_config(options.train_config, options.robot)   # errors name file and field
        self.trials = int(options.trials or self.cfg.trials)
        if self.trials < 2:
            raise ValueError("--trials must be at least 2 (trial 0 explores; a policy needs trial 1)")
        self.eval_seeds = tuple(options.eval_seeds or self.cfg.evaluation_seeds or (100,))
        from mcpilco_core.simulation import load_robot_profile

        self.profile_spec = options.robot_profile or self.cfg.robot_profile
        self.profile = load_robot_profile(self.profile_spec)     # a bad profile: ConfigError naming file and field
        self.disturbance_from = int(self.cfg.initial_state.disturbance_trial_from if options.disturbance_from is None
                                    else options.disturbance_from)
        if self.disturbance_from < 0:
            raise ValueError(f"--disturbance-from must be >= 0 (0 = never), got {self.disturbance_from}")
        if options.check:                # a bad check fails now, not after the session
            from mcpilco_core.learning.selection import RobotCheck

            RobotCheck(options.check, options.check_seconds, options.check_seed, None, options.check_tolerance)
            self.model_protocol()
        self.out = Path(options.out).resolve()
        if (self.out / "session").exists():
            raise ValueError(f"{self.out}: holds a session already; choose a new --out")
        for sub in ("logs", "params", "trials"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        self.robot_file = Path(self.cfg.robot.source).resolve()
        self.rows: list[TrialRow] = []
        self.t0 = time.perf_counter()
        env = ros_environment(self.out / "logs" / "ros")
        for key in ROS_ENV_KEYS:        # this process's own node must share the nodes' domain
            if key in env:
                os.environ[key] = env[key]
        self.guard = InterruptGuard()
        self.nodes = NodeProcesses(self.out / "logs", env, self.guard)
        self.ros: RosClient | None = None

    def say(self, message: str) -> None:
        if not self.o.quiet:
            print(f"[{time.perf_counter() - self.t0:7.1f} s] {message}", flush=True)

    # ------------------------------------------------------------------ startup
    def _params(self) -> Path:
        cfg = self.cfg
        return write_overrides(self.out / "params" / "session.yaml", {
            "controller_node": {"policy": "", "arm_on_start": False, "watchdog_timeout": WATCHDOG_TIMEOUT,
                                "diagnostics_period": 0.2, "selection_wait_for_workers": True,   # lockstep
                                "exploration": {
                                    "enabled": True, "amplitude": float(cfg.exploration_amplitude),
                                    "seed": int(cfg.seed)}},
            "trainer_node": {"session_dir": str(self.out / "session"), "run_dir": str(self.out / "retrain"),
                             "train_config": str(Path(cfg.source).resolve()), "retrain_after_trial": False,
                             "warm_start": True, "retrain_threads": int(cfg.threads),
                             "retrain_timeout": float(self.o.retrain_timeout), "diagnostics_period": 0.2,
                             "driver": "sim_driver_node",
                             "notes": self.o.notes or f"mcpilco session --sim, {self.trials} trials"},
        })

    def start_nodes(self) -> None:
        from mcpilco_core.paths import config_dir

        params = self._params()
        self.nodes.start("controller_node", "controller_node", [self.robot_file, params])
        self.nodes.start("trainer_node", "trainer_node", [self.robot_file, config_dir() / "trainer.yaml", params])
        self.ros = RosClient(self.nodes, ("controller_node", "trainer_node"))
        timeout = self.o.startup_timeout
        self.ros.wait(lambda: self.ros.value("controller_node", "exploring") == "True", timeout,
                      "controller_node up, exploring (its diagnostics)")
        self.ros.wait(lambda: self.ros.value("trainer_node", "controller_policy_version") == "none", timeout,
                      "trainer_node up and hearing the controller")
        self.say(f"nodes up: controller_node (no policy, exploration +-{self.cfg.exploration_amplitude} N m), "
                 f"trainer_node (session {self.out / 'session'}); logs in {self.out / 'logs'}")

    # ------------------------------------------------------------------ one trial
    def initial_state(self, k: int) -> np.ndarray:
        """Where trial k starts: the offline learner's own rule (``trial_start_state``: the curriculum box)."""
        from mcpilco_core.learning.learner import trial_start_state

        return trial_start_state(self.cfg, k)

    def _wait_for_final_state(self, record: Path, k: int) -> None:
        """Before the bag is closed: wait until the trainer has recorded the simulated robot's final state.

        The robot exits once the controller answered that state; the trainer receives it on its own, possibly
        later, and a bag closed first would lack the trial's last sample. A trial whose final state never
        arrives is kept as recorded (warning), as a real robot's would be."""
        if not record.is_file():
            return
        with np.load(record) as data:
            final = int(data["final_state_stamp_ns"]) if "final_state_stamp_ns" in data else -1
        if final < 0:
            return
        try:
            self.ros.wait(lambda: int(self.ros.value("trainer_node", "last_state_stamp_ns", "-1")) >= final,
                          FINAL_STATE_TIMEOUT, f"trainer recording trial {k}'s final state")
        except SessionError as exc:
            self.say(f"warning: {exc}; the bag is closed without it")

    def is_disturbance_trial(self, k: int) -> bool:
        """Trial k begins with a disturbance window (``--disturbance-from``; never trial 0, which explores)."""
        return 1 <= self.disturbance_from <= k

    def run_trial(self, k: int, policy: Path | None, version: str) -> TrialRow:
        """Start the simulated robot, record it while the armed controller acts, stop; the trial's row."""
        from mcpilco_core.learning.cost import trial_cost
        from mcpilco_core.learning.learner import disturbance_seed, trial_noise_seed
        from mcpilco_core.recording import SessionDirectory, load_trial

        ros, started = self.ros, time.perf_counter()
        duration = self.cfg.exploration_duration if k == 0 else self.cfg.trial_duration
        x0 = self.initial_state(k)
        disturb = self.is_disturbance_trial(k)
        record = self.out / "trials" / f"trial_{k:03d}.npz"
        sim_params = write_overrides(self.out / "params" / f"sim_trial_{k:03d}.yaml", {"sim_driver_node": {
            "mode": "lockstep", "lockstep_timeout": LOCKSTEP_TIMEOUT, "initial_state": [float(v) for v in x0],
            "duration": float(duration), "record_file": str(record), "exit_when_done": True,
            "robot_profile": str(self.profile_spec), "protocol": {"seed": trial_noise_seed(self.cfg.seed, k)},
            "disturbance": {"seed": disturbance_seed(self.cfg.seed, k)}}})
        name = f"sim_driver_trial_{k:03d}"
        what = "exploration, random torques" if k == 0 else f"policy {version}"
        what += ", after a disturbance window" if disturb else ""
        self.say(f"trial {k}/{self.trials - 1}: {what}, {duration:g} s from x0 = {(np.round(x0, 3) + 0.0).tolist()}")
        sim = self.nodes.start(name, "sim_driver_node", [self.robot_file, sim_params])
        window = self._start_disturbance_trial(name) if disturb else None
        if not disturb:
            ros.trigger(ros.start_trial, "start_trial")
        ros.wait(lambda: int(ros.value("trainer_node", "states_recorded", "0")) > 0, self.o.startup_timeout,
                 f"trainer recording the simulated robot ({self.nodes.tail(name)})")
        ros.set_bool(ros.enable, True, "arm the controller")
        ros.wait(lambda: sim.poll() is not None, self.o.trial_timeout, f"trial {k} finished")
        self._wait_for_final_state(record, k)
        stopped = ros.trigger(ros.stop_trial, "stop_trial")
        ros.set_bool(ros.enable, False, "disarm the controller")
        self.nodes.stop(name)
        if sim.returncode != 0 or not record.is_file():
            raise SessionError(f"simulated robot of trial {k} ended with code {sim.returncode}: "
                               f"{self.nodes.tail(name)}")
        trial = load_trial(self.out / "session" / f"trial_{k:03d}", self.cfg.robot)
        with np.load(record) as data:
            lost = int(data["lockstep_timeouts"])
            steps, window_steps = len(data["u"]), int(np.sum(np.diff(data["disturbance_windows"], axis=1)))
        total, mean = trial_cost(trial, self.cfg.cost)
        entry = SessionDirectory.open(self.out / "session").info["trials"][k]
        dt = self.cfg.robot.control_period
        row = TrialRow(k, "explore" if k == 0 else "policy", str(policy or ""), version, x0.tolist(), duration,
                       dict(entry["messages"]), int(trial.valid.sum()), mean, total,
                       timings_s={"trial": time.perf_counter() - started}, robot_time_s=steps * dt,
                       window_s=window_steps * dt, disturbance=window)
        self.say(f"trial {k}: bag trial_{k:03d} closed ({stopped.split(': ', 1)[-1]}); "
                 f"{row.transitions} transitions of {self.cfg.robot.policy_period * 1e3:g} ms, cost {row.cost_sum:.2f} "
                 f"(mean {row.cost:.3f} per state)"
                 f"{f', {lost} steps without an answer' if lost else ''}; robot time {row.robot_time_s:.3f} s"
                 f"{f' (window {row.window_s:.3f} s)' if window else ''}")
        return row

    def _start_disturbance_trial(self, sim_name: str) -> dict:
        """Record a disturbance trial: the trainer calls the driver's ~/disturb once it records; wait for the
        driver's answer (the window is armed before the controller is, so it starts at the trial's first step)."""
        ros = self.ros
        ros.wait(lambda: ros.value("trainer_node", "disturb_ready") == "True", self.o.startup_timeout,
                 f"trainer_node seeing the simulated robot's ~/disturb ({self.nodes.tail(sim_name)})")
        before = int(ros.value("trainer_node", "disturbance_answers", "0"))
        ros.trigger(ros.start_disturbance_trial, "start_disturbance_trial")
        ros.wait(lambda: int(ros.value("trainer_node", "disturbance_answers", "0")) > before, self.o.startup_timeout,
                 "the simulated robot's answer to ~/disturb")
        answer = ros.value("trainer_node", "last_disturbance")
        try:
            window = json.loads(answer)
        except json.JSONDecodeError:
            raise SessionError(f"~/disturb refused: {answer} ({self.nodes.tail(sim_name)})") from None
        self.say(f"disturbance window towards {np.round(window['target'], 3).tolist()} rad, "
                 f"{window['torque_limit']:g} N m limit")
        return window

    # ------------------------------------------------------------------ retraining
    def start_retrain(self, k: int) -> int:
        before = int(self.ros.value("trainer_node", "retrains_finished", "0"))
        self.ros.trigger(self.ros.retrain, "retrain")
        self.say(f"retrain {k}: fitting the model and optimising the policy on trials 0..{k - 1} "
                 f"(trainer's separate process)")
        return before

    def finish_retrain(self, k: int, before: int, started: float) -> tuple[Path, str, dict]:
        """Wait for the retrain to end and for the controller to run its policy; (policy file, version, entry)."""
        ros = self.ros
        ros.wait(lambda: int(ros.value("trainer_node", "retrains_finished", "0")) > before, self.o.retrain_timeout,
                 f"retrain {k}")
        last = ros.value("trainer_node", "last_retrain")
        if last.startswith(("failed", "stopped")):
            raise SessionError(f"retrain {k} {last}")
        entry = json.loads((self.out / "retrain" / "retrain.json").read_text(encoding="utf-8"))["retrains"][-1]
        version = entry["policy_version"]
        ros.wait(lambda: ros.value("controller_node", "policy_version") == version
                 and ros.value("trainer_node", "controller_policy_version") == version, 60.0,
                 f"controller running policy {version} (trainer: {ros.value('trainer_node', 'last_reload')})")
        timings = entry.get("timings_s", {})
        self.say(f"retrain {k}: {Path(entry['policy']).name} in {time.perf_counter() - started:.1f} s ("
                 + ", ".join(f"{name} {v:.1f} s" for name, v in timings.items())
                 + f"; final model cost {entry.get('final_model_cost') or float('nan'):.3f}); hot-reloaded")
        return Path(entry["policy"]), version, entry

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, row: TrialRow) -> None:
        from mcpilco_core.evaluation import ControllerSpec, evaluate_seeds

        start = time.perf_counter()
        results = evaluate_seeds(ControllerSpec(str(self.robot_file), row.policy), self.eval_seeds,
                                 jobs=self.o.eval_jobs, duration=self.o.eval_duration, profile=self.profile)
        row.eval_scores = [float(r.score) for r in results]
        row.eval_score = float(np.mean(row.eval_scores))
        row.eval_time_s = len(self.eval_seeds) * self.o.eval_duration    # a report only: not robot time
        row.timings_s["evaluation"] = time.perf_counter() - start
        self.say(f"trial {row.trial} policy {row.policy_version}: evaluation score {row.eval_score:.4f} "
                 f"(seeds {list(self.eval_seeds)}, {self.o.eval_duration:g} s protocol, robot profile "
                 f"{self.profile.label}; a report, not robot time)")

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """The whole session; SIGINT and SIGTERM become KeyboardInterrupt meanwhile (see InterruptGuard), so every
        exit path stops the nodes."""
        self.say(f"session: {self.cfg.robot.robot}, {self.trials} trials, training config {self.cfg.source}, "
                 f"robot profile {self.profile.label}, disturbance trials "
                 f"{f'from trial {self.disturbance_from}' if self.disturbance_from else 'never'}, out {self.out}")
        self.guard.install()
        try:
            self.start_nodes()
            self._loop()
        except BaseException as exc:   # a failed trial or retrain, Ctrl-C: the robot time spent is still counted
            self.shutdown()
            self.write_aborted(exc)
            raise
        finally:
            self.shutdown()
            self.guard.restore()
        return self.report()

    def write_aborted(self, exc: BaseException) -> None:
        """session.json for a session that did not finish: status "aborted", why, the finished trials' rows and
        robot time, and the robot time of the trial under way (its record file's steps, else the span of the states
        its bag holds; None when neither says). Why: the robot ran those seconds, finished or not."""
        k = len(self.rows)
        try:
            under_way = self._robot_time_of_unfinished_trial(k)
        except Exception as err:  # noqa: BLE001 -- the accounting must not hide the session's own error
            under_way = None
            self.say(f"trial {k}: its robot time could not be read ({type(err).__name__}: {err})")
        robot_time = self.robot_time()
        if under_way is not None:
            robot_time["unfinished_trial"] = under_way
            robot_time["total"] += under_way
        result = {"robot": self.cfg.robot.robot, "train_config": str(self.cfg.source), "status": "aborted",
                  "reason": f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                  "trials": [vars(r) for r in self.rows], "unfinished_trial": k if k < self.trials else None,
                  "robot_profile": self.profile.label, "robot_time_s": robot_time["total"],
                  "robot_time_breakdown_s": robot_time, "wall_s": time.perf_counter() - self.t0}
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "session.json").write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
        self.say(f"session aborted ({result['reason']}): {len(self.rows)} trial(s) finished, robot time "
                 f"{robot_time['total']:.3f} s counted in {self.out / 'session.json'}")

    def _robot_time_of_unfinished_trial(self, k: int) -> float | None:
        """s the simulated robot ran in trial ``k`` (not finished): its record file, else its bag's state span."""
        record = self.out / "trials" / f"trial_{k:03d}.npz"
        if record.is_file():
            with np.load(record) as data:
                return len(data["u"]) * self.cfg.robot.control_period
        from mcpilco_core.recording import STATE_TOPIC, header_stamp_ns, read_bag
        from mcpilco_core.recording.salvage import stored_messages

        for bag in (self.out / "session" / f"trial_{k:03d}", self.out / "session" / f"trial_{k:03d}.partial"):
            if bag.is_dir():
                if (bag / "metadata.yaml").is_file():
                    stamps = read_bag(bag).state_t
                else:   # left partial by a trainer that died too (read_bag refuses it): the states on disk
                    found = (header_stamp_ns(data) for topic, _, data in stored_messages(bag) if topic == STATE_TOPIC)
                    stamps = np.array([s for s in found if s is not None], dtype=np.int64)
                return float(stamps.max() - stamps.min()) * 1e-9 if len(stamps) > 1 else 0.0
        return None

    def _loop(self) -> None:
        policy, version = None, "none"
        for k in range(self.trials):
            row = self.run_trial(k, policy, version)
            self.rows.append(row)
            if k == 0:
                self.ros.set_bool(self.ros.explore, False, "exploration off")
            retrain = None
            if k + 1 < self.trials:
                retrain = (self.start_retrain(k + 1), time.perf_counter())
            if k > 0:
                self.evaluate(row)   # while the trainer's process retrains
            if retrain is not None:
                policy, version, _ = self.finish_retrain(k + 1, *retrain)
                row.timings_s["retrain_after"] = time.perf_counter() - retrain[1]

    def shutdown(self) -> None:
        """Close this process's node, then stop every node process; another Ctrl-C meanwhile is ignored."""
        with self.guard.critical(reraise=False):
            try:
                if self.ros is not None:
                    ros, self.ros = self.ros, None
                    ros.close()
            finally:
                self.nodes.stop_all()

    # ------------------------------------------------------------------ report
    def report(self) -> dict:
        from mcpilco_core.learning.retrain import plot_session_curve

        rows = [vars(r) for r in self.rows]
        selection = self.choose_final() if self.o.check else None
        final = self.rows[selection.best] if selection else self.rows[-1]
        shutil.copyfile(final.policy, self.out / "policy.npz")
        plot = plot_session_curve(rows, self.out / "learning_curve.png",
                                  f"mcpilco session --sim: {self.cfg.robot.robot}, {Path(self.cfg.source).name}")
        robot_time = self.robot_time()
        if selection is not None:
            robot_time["selection_check"] = selection.robot_time
            robot_time["total"] += selection.robot_time
        result = {"robot": self.cfg.robot.robot, "train_config": str(self.cfg.source), "trials": rows,
                  "robot_profile": self.profile.label, "disturbance_from": self.disturbance_from,
                  "friction_compensation": self.cfg.robot.friction_compensation.enabled,
                  "robot_time_s": robot_time["total"], "robot_time_breakdown_s": robot_time,
                  "evaluation_time_s": sum(r.eval_time_s for r in self.rows),
                  "final_policy": final.policy, "final_policy_version": final.policy_version,
                  "final_policy_trial": final.trial, "final_policy_chosen_by": (
                      f"mcpilco select --check {self.o.check}" if selection else "the last trial"),
                  "final_score": final.eval_score, "final_scores": final.eval_scores,
                  "eval_seeds": list(self.eval_seeds), "eval_duration_s": self.o.eval_duration,
                  "wall_s": time.perf_counter() - self.t0, "learning_curve": str(plot)}
        (self.out / "session.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        self.say(f"learning curve: mean cost per trial {[round(r.cost, 3) for r in self.rows]}, evaluation score per "
                 f"trial {[None if r.eval_score is None else round(r.eval_score, 4) for r in self.rows]}")
        self.say(f"robot time {robot_time['total']:.3f} s (exploration {robot_time['exploration']:.3f}, trials "
                 f"{robot_time['trials']:.3f}, windows {robot_time['windows']:.3f}, selection check "
                 f"{robot_time.get('selection_check', 0.0):.3f}); evaluation runs "
                 f"{result['evaluation_time_s']:g} s of simulated protocol, reported apart")
        self.say(f"final policy {final.policy_version} (trial {final.trial}, {result['final_policy_chosen_by']}): "
                 f"score {final.eval_score:.4f} over seeds "
                 f"{list(self.eval_seeds)} ({self.o.eval_duration:g} s protocol); wrote {plot}, "
                 f"{self.out / 'session.json'}, {self.out / 'policy.npz'}")
        return result


    def choose_final(self):
        """The final policy by ``mcpilco select --check``: the retrained policies ranked on the session's newest
        model, the best ``check`` of them run for ``check_seconds`` of the protocol each on the session's simulated
        robot (the evaluator; the same numbers as the lockstep driver), that robot time counted. None (the last
        trial's policy stays final) when the selection cannot run, e.g. no post-disturbance states."""
        from mcpilco_core.learning.selection import RobotCheck, select_session_policy, write_selection

        check = RobotCheck(self.o.check, self.o.check_seconds, self.o.check_seed, self.profile_spec,
                           self.o.check_tolerance)
        try:
            selection = select_session_policy(self.out, check=check, protocol=self.model_protocol())
        except (ValueError, OSError) as exc:      # the session's data stays; the last trial's policy is final
            self.say(f"selection failed ({exc}); the final policy is the last trial's")
            return None
        write_selection(selection, self.out / "selection.json")
        on_model = {k: round(v, 3) for k, v in selection.protocol_scores.items()}
        self.say(f"selection: protocol on the model {on_model}; "
                 f"model costs {({k: round(v, 3) for k, v in selection.costs.items()})}; robot check "
                 f"{({k: round(v, 3) for k, v in selection.check_scores.items()})} (on the model "
                 f"{({k: round(v, 3) for k, v in selection.check_predictions.items()})}; {selection.robot_time:g} s of "
                 f"robot time) -> trial {selection.best}")
        return selection

    def model_protocol(self):
        """The choice's ranking (:class:`ModelProtocol`, or None to rank by the model cost); errors on bad options."""
        from mcpilco_core.learning.selection import ModelProtocol

        if self.o.rank not in ("protocol", "cost"):
            raise ValueError(f"--rank must be 'protocol' or 'cost', got {self.o.rank!r}")
        return ModelProtocol(seconds=self.o.protocol_seconds) if self.o.rank == "protocol" else None

    def robot_time(self) -> dict[str, float]:
        """Seconds the robot ran for learning: exploration (trial 0), trials (without their windows), disturbance
        windows, and their total (every simulated step of every trial)."""
        explore = sum(r.robot_time_s for r in self.rows if r.mode == "explore")
        windows = sum(r.window_s for r in self.rows)
        total = sum(r.robot_time_s for r in self.rows)
        return {"exploration": explore, "trials": total - explore - windows, "windows": windows, "total": total}


def run_session(options: SessionOptions) -> dict:
    """Run a whole simulated session (module docstring); returns session.json's content."""
    return SimSession(options).run()


# --------------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--robot", choices=ROBOTS, default="pendubot")
    parser.add_argument("--sim", action="store_true", required=True,
                        help="against the simulated robot (required: on hardware run the nodes yourself, "
                             "see docs/sessions.md)")
    parser.add_argument("--trials", type=int, help="trials including trial 0 (default: the training config's)")
    parser.add_argument("--config", type=Path, help="training YAML (default: the bundled config/train_<robot>.yaml)")
    parser.add_argument("--out", type=Path, required=True, help="new output directory, e.g. runs/session_pendubot")
    parser.add_argument("--eval-seeds", type=int, nargs="+", default=[],
                        help="evaluation protocol seeds (default: the training config's, else 100)")
    parser.add_argument("--eval-duration", type=float, default=60.0, help="s of evaluation protocol (default 60)")
    parser.add_argument("--jobs", type=int, default=1, help="evaluation worker processes")
    parser.add_argument("--trial-timeout", type=float, default=600.0, help="s of wall time per trial")
    parser.add_argument("--retrain-timeout", type=float, default=7200.0, help="s of wall time per retrain")
    parser.add_argument("--robot-profile", help="the simulated robot (config/robot_profiles.yaml: nominal, "
                        "hardware_proxy, perturbed, NAME:SEED, or a profile YAML file; default: the training "
                        "config's robot_profile); the evaluation scores on it too")
    parser.add_argument("--disturbance-from", type=int, metavar="K",
                        help="trials K, K+1, ... begin with a disturbance window (the protocol's 0.2 s reset PID on "
                             "both motors, run by the driver); 0 = never (default: the training config's "
                             "initial_state.disturbance_trial_from)")
    parser.add_argument("--check", type=int, default=0, metavar="K",
                        help="choose the final policy by `mcpilco select --check K`: the model's best K retrained "
                             "policies each run --check-seconds of the protocol on the robot, the one up the longest "
                             "is final (counted robot time); 0 = the last trial's policy")
    parser.add_argument("--check-seconds", type=float, default=20.0, help="s of the protocol per checked policy")
    parser.add_argument("--check-seed", type=int, default=1000, help="seed of the check's disturbance schedule")
    parser.add_argument("--check-tolerance", type=tolerance_arg, default=0.15,
                        help="the check runs the candidates in rank order and stops at the first whose robot score "
                             "is at least its score on the model minus this; 'none': all, the best robot score")
    parser.add_argument("--rank", choices=("protocol", "cost"), default="protocol",
                        help="with --check: rank the policies by the protocol simulated on the model's plant (no "
                             "robot time) or by the model cost, before the check")
    parser.add_argument("--protocol-seconds", type=float, default=60.0,
                        help="s of the protocol on the model per seed (4 seeds)")
    parser.add_argument("--notes", default="", help="free text for session.yaml")
    parser.add_argument("--quiet", action="store_true")


def _run(args: argparse.Namespace) -> int:
    from mcpilco_core.learning.retrain import default_train_config

    options = SessionOptions(robot=args.robot, train_config=args.config or default_train_config(args.robot),
                             out=args.out, trials=args.trials, eval_seeds=tuple(args.eval_seeds),
                             eval_duration=args.eval_duration, eval_jobs=args.jobs,
                             trial_timeout=args.trial_timeout, retrain_timeout=args.retrain_timeout,
                             notes=args.notes, quiet=args.quiet, robot_profile=args.robot_profile,
                             disturbance_from=args.disturbance_from, check=args.check,
                             check_seconds=args.check_seconds, check_seed=args.check_seed,
                             check_tolerance=args.check_tolerance, rank=args.rank,
                             protocol_seconds=args.protocol_seconds)
    try:
        run_session(options)
    except (SessionError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: every node process was stopped; the bags recorded so far are complete",
              file=sys.stderr)
        return 130
    return 0


def register(subparsers) -> None:
    """``mcpilco session``: for mcpilco_ros.cli's COMMAND_MODULES (imports nothing of ROS here)."""
    p = subparsers.add_parser("session", help="the hardware loop (explore, record, retrain, reload) against the "
                                              "simulated robot over ROS", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcpilco_ros.sim_session", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
