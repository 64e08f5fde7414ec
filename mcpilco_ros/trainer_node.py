"""trainer_node: records hardware trials into rosbag2 bags and retrains the policy between trials.

- ``~/start_trial`` / ``~/stop_trial`` (std_srvs/Trigger): record ``joint_states``, ``joint_commands`` (whose
  ``header.frame_id`` is the controller's mode) and ``diagnostics`` into ``session_dir/trial_NNN`` -- raw CDR
  straight from the subscriptions, through :mod:`mcpilco_core.recording` (temporary name, renamed when closed,
  flushed every ``flush_period`` s). ``trial_duration`` > 0 stops a trial by itself after that many seconds.
- *Disturbance trials*: ``~/start_disturbance_trial`` (Trigger), or every ``~/start_trial`` with
  ``disturbance_trials: true``, starts the recording and then calls the driver's ``~/disturb`` (``driver``; ""
  = ``moteus_driver_node`` or ``sim_driver_node``, whichever offers it; refused before anything is recorded when
  none does): the trial begins with one 0.2 s window of the protocol's reset PID on both motors towards a random
  target, run by the driver itself. The driver's answer (window index, target, seed, torque limit) goes into the
  trial's session.yaml entry (``disturbance``) and diagnostics (``last_disturbance``); the recorded
  ``joint_states`` mark the window (frame_id "reset"), whose intervals the reader keeps from the model.
  A DDS service may lose its answer (Fast DDS drops a response when the server has not yet matched the client's
  reader, as with a driver that has just started on a loaded machine) while the window runs. So when no answer
  comes within ``disturb_answer_timeout`` s, the driver's own diagnostics decide: a new window there
  (``disturbance_last``, its JSON, changed or ``disturbance_windows`` grown) is taken as the answer (``answered_by:
  diagnostics``); none within 10 times that is a refusal ("no answer"). The call is never repeated (it would
  start a second window).
- ``~/retrain`` (Trigger), or ``retrain_after_trial``: runs ``python -m mcpilco_core.learning.retrain retrain`` on
  the session in a **separate, niced process** (the control loop's process and its executor are never
  blocked), which exports ``run_dir/policies/policy_NNN_<version>.npz`` (never overwriting), then sets the
  controller's ``policy`` parameter to that file and calls its ``~/reload_policy``.
- ``diagnostics``: recording state, message counts, the newest ``joint_states`` stamp recorded
  (``last_state_stamp_ns``: a simulated robot exits once the *controller* answered its final state, so
  ``mcpilco session`` waits for this to reach that state's stamp before ``~/stop_trial``), retrain state
  (started / finished counts) and the last exported policy and reload answer (what ``mcpilco session`` waits on).

The node never commands torque; the policy version written into each trial is the one the controller reports
in its diagnostics (``policy_version`` key of the ``controller_node: controller`` status).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Parameter as ParameterMsg
from rcl_interfaces.msg import ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger

from mcpilco_core import recording
from mcpilco_core.paths import config_dir

from ._ros_utils import ERROR, OK, WARN, ConfiguredNode, ParameterError, ParamSpec, run_node

NODE_NAME = "trainer_node"

# Recording must not drop messages: reliable, with a queue that covers a slow disk for a moment (500 Hz).
RECORD_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=500, reliability=ReliabilityPolicy.RELIABLE)

TRAINER_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("session_dir", "sessions/current", "session directory: one bag per trial + session.yaml"),
    ParamSpec("extra_sessions", "", "comma-separated earlier session directories that retraining also uses"),
    ParamSpec("notes", "", "free text stored in session.yaml"),
    ParamSpec("storage", "mcap", "bag storage: mcap or sqlite3", choices=tuple(recording.STORAGES)),
    ParamSpec("bag_version", 9, "rosbag2 metadata version: 9 (Jazzy and newer) or 8 (readable by Humble)", 8, 9),
    ParamSpec("trial_duration", 0.0, "s; a trial stops by itself after this long (0 = at ~/stop_trial)",
              0.0, 86400.0),
    ParamSpec("flush_period", 1.0, "s; bags are flushed this often: the most a crash can lose", 0.01, 60.0),
    ParamSpec("record_diagnostics", True, "also record the diagnostics topic"),
    ParamSpec("retrain_after_trial", False, "start retraining when a trial stops"),
    ParamSpec("train_config", "", "training YAML; '' = the package's config/train_<robot>.yaml"),
    ParamSpec("run_dir", "runs/trainer", "retrain run directory (policies/, models/, retrain.json)"),
    ParamSpec("warm_start", True, "start each retrain from the newest model and policy in run_dir"),
    ParamSpec("retrain_nice", 10, "niceness of the retraining process (higher = lower priority)", 0, 19),
    ParamSpec("retrain_threads", 1, "CPU threads of the retraining process", 1, 256),
    ParamSpec("retrain_timeout", 7200.0, "s before a retraining process is stopped", 1.0, 1e6),
    ParamSpec("controller", "controller_node", "node whose policy parameter and ~/reload_policy are used "
              "('' = do not reload)"),
    ParamSpec("disturbance_trials", False, "every ~/start_trial begins with a disturbance window (the driver's "
              "~/disturb, called once the recording runs); ~/start_disturbance_trial asks for one trial"),
    ParamSpec("driver", "", "driver node offering ~/disturb ('' = moteus_driver_node or sim_driver_node, whichever "
              "offers it)"),
    ParamSpec("disturb_answer_timeout", 3.0, "s without an answer from ~/disturb before the driver's diagnostics "
              "are read instead (module docstring)", 0.1, 600.0),
)
DRIVERS = ("moteus_driver_node", "sim_driver_node")


class TrainerNode(ConfiguredNode):
    """See the module docstring. Raises ParameterError on bad parameters."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, TRAINER_PARAMETERS, **kwargs)
        self.train_config = Path(self.p["train_config"] or config_dir() / f"train_{self.config.robot}.yaml")
        if not self.train_config.is_file():
            raise ParameterError(f"parameter 'train_config': {self.train_config}: no such file")
        try:
            self.session = recording.SessionDirectory.create(self.p["session_dir"], self.config, self.p["notes"])
        except recording.TrialError as exc:
            raise ParameterError(f"parameter 'session_dir': {exc}") from exc
        if self.session.partial_bags():
            recovered = recording.recover_session(self.session.root)
            self.session = recording.SessionDirectory.open(self.session.root)   # re-read: the recovery saved it
            self.get_logger().warning(f"recovered partial bag(s) left by a crash: {[str(p) for p in recovered]}")
        self.recorder: recording.TrialRecorder | None = None
        self._trial_timer = None
        self._trial_started = 0.0
        self.controller_policy_version = "unknown"
        self.retrain_proc: subprocess.Popen | None = None
        self._retrain_started = 0.0
        self._retrain_log: Path | None = None
        self.retrain_count = 0
        self.retrains_finished = 0          # retrains that ended (exported, failed or stopped)
        self.last_retrain = ""
        self.last_policy = ""
        self.last_reload = ""
        self.disturbance_requests = 0       # ~/disturb calls made
        self.disturbance_answers = 0        # ... and answered (accepted or refused)
        self.last_disturbance = ""          # the newest answer (JSON of the window, or why it was refused)
        self.driver_status: dict[str, dict[str, str]] = {}   # driver node -> its newest disturbance_* diagnostics
        self._pending_disturb: dict | None = None           # the ~/disturb call not answered yet

        topics = [recording.STATE_TOPIC, recording.COMMAND_TOPIC]
        for topic in topics:
            self.create_subscription(JointState, topic, self._recorder_callback(topic), RECORD_QOS, raw=True)
        self.create_subscription(DiagnosticArray, "diagnostics", self._on_diagnostics, 50, raw=True)
        self.create_service(Trigger, "~/start_trial", self._on_start)
        self.create_service(Trigger, "~/stop_trial", self._on_stop)
        self.create_service(Trigger, "~/retrain", self._on_retrain)
        self.create_service(Trigger, "~/start_disturbance_trial", self._on_start_disturbance)
        driver = str(self.p["driver"]).strip("/")
        self.disturb_clients = [self.create_client(Trigger, f"/{name}/disturb") for name in
                                ((driver,) if driver else DRIVERS)]
        controller = str(self.p["controller"]).strip("/")
        self.reload_client = self.create_client(Trigger, f"/{controller}/reload_policy") if controller else None
        self.param_client = self.create_client(SetParameters, f"/{controller}/set_parameters") if controller else None
        self.create_timer(0.2, self._poll_retrain)
        self.create_timer(0.2, self._poll_disturbance)
        self.get_logger().info(f"{self.config.robot}: session {self.session.root}, run dir {self.p['run_dir']}")

    # ---------------------------------------------------------------- recording
    def _recorder_callback(self, topic: str):
        def record(data: bytes) -> None:
            if self.recorder is not None:
                self.recorder.write(topic, data, self.get_clock().now().nanoseconds)
        return record

    def _on_diagnostics(self, data: bytes) -> None:
        if self.recorder is not None and self.p["record_diagnostics"]:
            self.recorder.write(recording.DIAGNOSTICS_TOPIC, data, self.get_clock().now().nanoseconds)
        msg = deserialize_message(data, DiagnosticArray)
        for st in msg.status:
            if st.name.startswith("controller_node"):
                values = {kv.key: kv.value for kv in st.values}
                self.controller_policy_version = values.get("policy_version", self.controller_policy_version)
            node = st.name.split(":", 1)[0]
            if node in DRIVERS:
                values = {kv.key: kv.value for kv in st.values if kv.key.startswith("disturbance_")}
                if values:
                    self.driver_status[node] = values

    def disturbance_client(self):
        """The client of the first driver whose ~/disturb is available, or None."""
        return next((c for c in self.disturb_clients if c.service_is_ready()), None)

    def start_trial(self, disturb: bool | None = None) -> tuple[bool, str]:
        """Start recording a trial; ``disturb`` (None = the ``disturbance_trials`` parameter): it begins with a
        disturbance window (the driver's ~/disturb is called once the recording runs)."""
        if self.recorder is not None:
            return False, f"already recording {self.recorder.final}"
        disturb = bool(self.p["disturbance_trials"]) if disturb is None else disturb
        client = self.disturbance_client() if disturb else None
        if disturb and client is None:
            return False, (f"cannot start a disturbance trial: no driver offers ~/disturb "
                           f"({', '.join(c.srv_name for c in self.disturb_clients)})")
        topics = [recording.STATE_TOPIC, recording.COMMAND_TOPIC]
        if self.p["record_diagnostics"]:
            topics.append(recording.DIAGNOSTICS_TOPIC)
        try:
            self.recorder = self.session.start_trial(self.controller_policy_version, notes=self.p["notes"],
                                                     storage=self.p["storage"], version=int(self.p["bag_version"]),
                                                     flush_period=float(self.p["flush_period"]), topics=topics)
        except (recording.TrialError, OSError) as exc:
            return False, f"cannot start a trial: {exc}"
        self._trial_started = time.monotonic()
        if self.p["trial_duration"] > 0:
            self._trial_timer = self.create_timer(float(self.p["trial_duration"]), self._on_trial_timeout)
        message = f"recording {self.recorder.final} (policy {self.controller_policy_version})"
        if client is not None:
            self._request_disturbance(client, self.recorder.final.name)
            message += f"; disturbance window requested from {client.srv_name}"
        return True, message

    def _request_disturbance(self, client, bag: str) -> None:
        """Call the driver's ~/disturb; its answer (or, failing that, its diagnostics: module docstring) goes into
        the trial's session.yaml entry when it comes."""
        self.session.entry(bag)["disturbance"] = {"status": "requested", "service": client.srv_name}
        self.session.save()
        self.disturbance_requests += 1
        node = client.srv_name.strip("/").split("/")[0]
        before = self.driver_status.get(node, {})      # may be an earlier process's (a new driver per trial)
        pending = {"bag": bag, "node": node, "since": time.monotonic(),
                   "windows_before": int(before.get("disturbance_windows", "0") or 0),
                   "last_before": before.get("disturbance_last", "")}
        self._pending_disturb = pending
        future = client.call_async(Trigger.Request())
        pending["future"] = future
        future.add_done_callback(lambda done: self._after_disturb(done, pending))

    def _after_disturb(self, future, pending: dict) -> None:
        answer = future.result()
        if self._pending_disturb is not pending:
            self.get_logger().warning(f"{pending['bag']}: late ~/disturb answer ignored (already settled): "
                                      f"{answer.message if answer is not None else None}")
            return
        if answer is not None and answer.success:
            self._settle_disturbance(pending, True, answer.message, "service")
        else:
            self._settle_disturbance(pending, False, answer.message if answer is not None
                                     else "no answer from ~/disturb", "service")

    def _poll_disturbance(self) -> None:
        """An unanswered ~/disturb: after ``disturb_answer_timeout`` s, a new window in the driver's diagnostics
        is the answer; after 10 times that, none is a refusal."""
        pending = self._pending_disturb
        if pending is None or pending["future"].done():
            return
        waited, timeout = time.monotonic() - pending["since"], float(self.p["disturb_answer_timeout"])
        if waited < timeout:
            return
        values = self.driver_status.get(pending["node"], {})
        last = values.get("disturbance_last", "")
        if last and (last != pending["last_before"] or
                     int(values.get("disturbance_windows", "0") or 0) > pending["windows_before"]):
            self.get_logger().warning(f"{pending['bag']}: no answer from /{pending['node']}/disturb in "
                                      f"{waited:.1f} s; its diagnostics show the window")
            self._settle_disturbance(pending, True, last, "diagnostics")
        elif waited >= 10.0 * timeout:
            self._settle_disturbance(pending, False, f"no answer from /{pending['node']}/disturb within "
                                     f"{waited:.1f} s, and no new window in its diagnostics", "timeout")

    def _settle_disturbance(self, pending: dict, accepted: bool, message: str, answered_by: str) -> None:
        """Write the ~/disturb outcome into the trial's entry and the counters (once per call)."""
        self._pending_disturb = None
        bag = pending["bag"]
        self.disturbance_answers += 1
        self.last_disturbance = message
        entry = self.session.entry(bag)
        if accepted:
            try:
                window = json.loads(message)
            except json.JSONDecodeError:
                window = {"message": message}
            entry["disturbance"] = {**entry.get("disturbance", {}), "status": "accepted", **window}
            if answered_by != "service":
                entry["disturbance"]["answered_by"] = answered_by
            self.get_logger().info(f"{bag}: disturbance window {message}")
        else:
            entry["disturbance"] = {**entry.get("disturbance", {}), "status": "refused", "reason": message}
            self.get_logger().error(f"{bag}: ~/disturb refused: {message}")
        self.session.save()

    def stop_trial(self, retrain: bool = True) -> tuple[bool, str]:
        """Close the trial's bag; then retrain when ``retrain_after_trial`` (and ``retrain``: not on shutdown, where
        the retrain would only be started to be terminated)."""
        if self.recorder is None:
            return False, "no trial is being recorded"
        recorder, self.recorder = self.recorder, None
        if self._trial_timer is not None:
            self.destroy_timer(self._trial_timer)
            self._trial_timer = None
        try:
            entry = self.session.finish_trial(recorder)
        except (recording.TrialError, OSError) as exc:
            return False, f"{recorder.partial}: could not close the bag ({exc}); it stays recoverable"
        message = f"{recorder.final}: {entry['messages']} in {entry['duration_s']:.1f} s"
        if self.p["retrain_after_trial"] and retrain:
            message += "; " + self.start_retrain()[1]
        return True, message

    def _on_trial_timeout(self) -> None:
        ok, message = self.stop_trial()
        self.get_logger().info(f"trial_duration reached: {message}")

    def _on_start(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.start_trial()
        self.get_logger().info(f"start_trial: {response.message}")
        return response

    def _on_start_disturbance(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.start_trial(disturb=True)
        self.get_logger().info(f"start_disturbance_trial: {response.message}")
        return response

    def _on_stop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.stop_trial()
        self.get_logger().info(f"stop_trial: {response.message}")
        return response

    # ---------------------------------------------------------------- retraining
    def retrain_command(self) -> list[str]:
        sessions = [str(self.session.root)] + [s.strip() for s in self.p["extra_sessions"].split(",") if s.strip()]
        cmd = [sys.executable, "-m", "mcpilco_core.learning.retrain", "retrain", "--sessions", *sessions,
               "--out", str(self.p["run_dir"]), "--config", str(self.train_config), "--json"]
        return cmd + (["--warm-start"] if self.p["warm_start"] else [])

    def start_retrain(self) -> tuple[bool, str]:
        if self.retrain_proc is not None:
            return False, f"a retrain is running already (pid {self.retrain_proc.pid})"
        run_dir = Path(self.p["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        self._retrain_log = run_dir / f"retrain_{time.strftime('%Y%m%d_%H%M%S')}_{self.retrain_count}.log"
        threads = str(self.p["retrain_threads"])
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        nice = int(self.p["retrain_nice"])
        with open(self._retrain_log, "wb") as log:
            self.retrain_proc = subprocess.Popen(self.retrain_command(), stdout=log, stderr=subprocess.STDOUT,
                                                 env=env, preexec_fn=(lambda: os.nice(nice)) if nice else None)
        self._retrain_started = time.monotonic()
        self.retrain_count += 1
        return True, f"retraining in process {self.retrain_proc.pid} (log {self._retrain_log})"

    def _poll_retrain(self) -> None:
        proc = self.retrain_proc
        if proc is None:
            return
        if proc.poll() is None:
            if time.monotonic() - self._retrain_started > self.p["retrain_timeout"]:
                proc.kill()
                proc.wait()
                self.retrain_proc = None
                self.retrains_finished += 1
                self.last_retrain = f"stopped after retrain_timeout {self.p['retrain_timeout']} s"
                self.get_logger().error(self.last_retrain)
            return
        self.retrain_proc = None
        self.retrains_finished += 1
        elapsed = time.monotonic() - self._retrain_started
        result = self._retrain_result()
        if proc.returncode != 0 or result is None:
            self.last_retrain = f"failed (exit {proc.returncode}) after {elapsed:.1f} s: see {self._retrain_log}"
            self.get_logger().error(f"retrain {self.last_retrain}")
            return
        self.last_policy = result["policy"]
        self.last_retrain = (f"{result['trials']} trials, {result['transitions']} transitions -> "
                             f"{result['policy']} in {elapsed:.1f} s")
        self.get_logger().info(f"retrain done: {self.last_retrain}")
        self._reload(str(Path(result["policy"]).resolve()))

    def _retrain_result(self) -> dict | None:
        lines = self._retrain_log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        for line in reversed(lines):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    return None
        return None

    def _on_retrain(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.start_retrain()
        self.get_logger().info(f"retrain: {response.message}")
        return response

    # ---------------------------------------------------------------- hot reload
    def _reload(self, policy_path: str) -> None:
        """Point the controller's ``policy`` parameter at the new file, then call its ``~/reload_policy``."""
        if self.reload_client is None:
            return
        if not self.param_client.service_is_ready() or not self.reload_client.service_is_ready():
            self.last_reload = f"controller services not available: {policy_path} not loaded"
            self.get_logger().warning(self.last_reload)
            return
        value = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=policy_path)
        request = SetParameters.Request(parameters=[ParameterMsg(name="policy", value=value)])
        self.param_client.call_async(request).add_done_callback(lambda future: self._after_set(future, policy_path))

    def _after_set(self, future, policy_path: str) -> None:
        results = future.result().results if future.result() else []
        if not results or not results[0].successful:
            reason = results[0].reason if results else "no answer"
            self.last_reload = f"controller refused policy parameter {policy_path}: {reason}"
            self.get_logger().error(self.last_reload)
            return
        self.reload_client.call_async(Trigger.Request()).add_done_callback(self._after_reload)

    def _after_reload(self, future) -> None:
        answer = future.result()
        self.last_reload = answer.message if answer else "no answer from reload_policy"
        log = self.get_logger().info if answer and answer.success else self.get_logger().error
        log(f"reload_policy: {self.last_reload}")

    # ---------------------------------------------------------------- diagnostics
    def publish_diagnostics(self) -> None:
        active = self.recorder is not None
        if self.last_retrain.startswith(("failed", "stopped")):
            level, message = ERROR, f"retrain {self.last_retrain}"
        elif self.retrain_proc is not None:
            level, message = OK, "retraining"
        elif active:
            level, message = OK, f"recording {self.recorder.final.name}"
        else:
            level, message = (WARN, "idle (no trial yet)") if not self.session.bags() else (OK, "idle")
        values = {"recording": active, "trial": self.recorder.final.name if active else "",
                  "trial_elapsed_s": time.monotonic() - self._trial_started if active else 0.0,
                  "messages": self.recorder.message_count if active else 0,
                  "states_recorded": self.recorder.counts.get(recording.STATE_TOPIC, 0) if active else 0,
                  "last_state_stamp_ns": self.recorder.last_stamp_ns.get(recording.STATE_TOPIC, -1) if active else -1,
                  "session": str(self.session.root), "trials_recorded": len(self.session.bags()),
                  "retraining": self.retrain_proc is not None, "retrains_started": self.retrain_count,
                  "retrains_finished": self.retrains_finished,
                  "last_retrain": self.last_retrain, "last_policy": self.last_policy,
                  "last_reload": self.last_reload, "controller_policy_version": self.controller_policy_version,
                  "disturb_ready": self.disturbance_client() is not None,
                  "disturbance_requests": self.disturbance_requests, "disturbance_answers": self.disturbance_answers,
                  "last_disturbance": self.last_disturbance}
        self.publish_status("trainer", level, message, values)

    def on_shutdown(self) -> None:
        """Close an open trial (so the bag is complete) and stop a running retrain."""
        if self.recorder is not None:
            self.stop_trial(retrain=False)    # the bag complete; retrain it later with `mcpilco retrain`
        if self.retrain_proc is not None and self.retrain_proc.poll() is None:
            self.retrain_proc.terminate()
            try:
                self.retrain_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.retrain_proc.kill()
                self.retrain_proc.wait()


def main(args: list[str] | None = None) -> int:
    """Console script ``trainer_node``; exits 2 with the reason when its parameters are invalid."""
    return run_node(TrainerNode, NODE_NAME, args)


if __name__ == "__main__":
    raise SystemExit(main())
