"""The ROS path reproduces ``mcpilco evaluate`` bit for bit, with the shipped policy in charge.

``mcpilco demo``'s path (controller_node and sim_driver_node as processes, lockstep, protocol on) for 10 s of
seed 5: the policy swings up, the LQR catches and balances, a PID disturbance throws the pendulum fast enough
for damping, the reset windows hand over to the controller again. The recorded time, state, applied and
commanded torque and mode arrays equal the in-process evaluator's exactly, step by step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rclpy")
from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.evaluation import evaluate_seed  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402
from mcpilco_core.simulation import MODE_CODES  # noqa: E402
from mcpilco_ros.demo import run_demo  # noqa: E402

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]
SEED, DURATION = 61, 10.0       # seed 61: damping after a disturbance with the shipped policy (checked below)


def test_ros_lockstep_run_equals_the_evaluator_array_by_array(tmp_path):
    config = load_robot_config(REPO / "config" / "pendubot.yaml")
    policy_file = REPO / "policies" / "pendubot.npz"
    result = run_demo("pendubot", seed=SEED, policy=policy_file, out_dir=tmp_path, quiet=True, duration=DURATION)
    assert result["lockstep_timeouts"] == 0
    ros = np.load(result["trajectory"])
    policy = load_policy(policy_file, robot="pendubot", torque_limit=config.torque_limit)
    reference = evaluate_seed(build_controller(config, policy), config, SEED, DURATION, keep_trajectory=True)
    ref = reference.trajectory

    # the controller really shapes this stretch: policy, LQR and damping each act (with torque), resets happen
    act = config.actuated_joint
    for name in ("policy", "lqr", "damping"):
        steps = ref.mode == MODE_CODES[name]
        assert steps.sum() >= 10 and np.any(ref.u[steps, act] != 0.0), name
    assert len(reference.windows) == 2 and np.sum(ref.mode == MODE_CODES["reset"]) >= 200

    for key in ("t", "x", "u", "u_cmd", "mode"):
        a, b = ros[key], getattr(ref, key)
        assert a.shape == b.shape and a.dtype == b.dtype, key
        mismatch = np.flatnonzero(np.any((a != b).reshape(len(a), -1), axis=1))
        assert mismatch.size == 0, f"{key} differs first at step {mismatch[0]}: ros {a[mismatch[0]]}, " \
                                   f"evaluate {b[mismatch[0]]}"
    np.testing.assert_array_equal(ros["windows"], np.asarray(reference.windows))
    assert float(ros["score"]) == reference.score


def ros_and_evaluator(robot: str, config_name: str, policy_name: str, tmp_path: Path, watch=None, seed: int = SEED):
    """The lockstep ROS run and the evaluator's trajectory for ``config/<config_name>`` with ``policies/<policy_name>``
    (protocol ``seed``); ``watch(supervisor)`` (optional) is called after each of the evaluator's steps."""
    config_file = REPO / "config" / config_name
    config = load_robot_config(config_file)
    policy_file = REPO / "policies" / policy_name
    result = run_demo(robot, seed=seed, policy=policy_file, config=config_file, out_dir=tmp_path, quiet=True,
                      duration=DURATION)
    assert result["lockstep_timeouts"] == 0
    supervisor = build_controller(config, load_policy(policy_file, robot=robot, torque_limit=config.torque_limit))

    class Watched:
        mode = property(lambda self: supervisor.mode)
        reset = staticmethod(supervisor.reset)

        def step(self, x: np.ndarray, t: float) -> np.ndarray:
            u = supervisor.step(x, t)
            if watch is not None:
                watch(supervisor)
            return u

    reference = evaluate_seed(Watched(), config, seed, DURATION, keep_trajectory=True).trajectory
    return config, np.load(result["trajectory"]), reference


def test_ros_lockstep_run_equals_the_evaluator_with_the_balance_dither(tmp_path):
    """The same with config/pendubot_dither.yaml: the shake's phase (from the LQR's take-over) is the same in
    the controller node as in the evaluator, step for step."""
    config, ros, ref = ros_and_evaluator("pendubot", "pendubot_dither.yaml", "pendubot_hardware_proxy.npz", tmp_path)
    assert np.sum(ref.mode == MODE_CODES["lqr"]) >= 100 and config.dither.amplitude > 0
    for key in ("t", "x", "u", "u_cmd", "mode"):
        np.testing.assert_array_equal(ros[key], getattr(ref, key), err_msg=key)


def test_ros_lockstep_run_equals_the_evaluator_with_the_catch(tmp_path):
    """The same with config/acrobot_catch.yaml: the catch's plans (solved one period ahead, held for their period)
    give the same torques in the controller node (which solves each plan after publishing its command) as in the
    evaluator (which solves it at its next step), step for step."""
    catching = []
    config, ros, ref = ros_and_evaluator("acrobot", "acrobot_catch.yaml", "acrobot.npz", tmp_path,
                                         lambda supervisor: catching.append(supervisor.catching))
    assert config.catch.enabled and sum(catching) >= 100      # steps whose torque came from a plan
    for key in ("t", "x", "u", "u_cmd", "mode"):
        np.testing.assert_array_equal(ros[key], getattr(ref, key), err_msg=key)


def test_ros_lockstep_run_equals_the_evaluator_with_the_policy_selection(tmp_path):
    """The same with config/acrobot_select.yaml: the selection's decisions (each spread over its lead in the controller
    node, which does a share after publishing each command; computed when due in the evaluator) pick the same
    policies at the same steps, so the runs are equal step for step."""
    selected = []
    config, ros, ref = ros_and_evaluator("acrobot", "acrobot_select.yaml", "acrobot.npz", tmp_path,
                                         lambda supervisor: selected.append(supervisor.selected))
    assert config.selection.enabled and len(set(selected)) >= 2       # another candidate than the loaded one ran
    for key in ("t", "x", "u", "u_cmd", "mode"):
        np.testing.assert_array_equal(ros[key], getattr(ref, key), err_msg=key)


def test_ros_lockstep_run_equals_the_evaluator_with_the_dither_phase_chosen(tmp_path):
    """The same with config/acrobot_dither_phase.yaml (no bank: the shake's starting phase chosen by the model): the
    phase shift the decisions pick reaches the shake identically in the controller node and in the evaluator."""
    offsets = []
    config, ros, ref = ros_and_evaluator("acrobot", "acrobot_dither_phase.yaml", "acrobot_hardware_proxy.npz", tmp_path,
                                         lambda supervisor: offsets.append((supervisor.dither_offset, supervisor.mode)),
                                         seed=2)
    assert config.selection.dither_phases == 2 and config.selection.bank == ""
    assert sum(offset != 0.0 and mode == "lqr" for offset, mode in offsets) >= 100   # the other phase shook
    for key in ("t", "x", "u", "u_cmd", "mode"):
        np.testing.assert_array_equal(ros[key], getattr(ref, key), err_msg=key)


def test_ros_lockstep_run_equals_the_evaluator_with_the_state_observer(tmp_path):
    """The same with config/acrobot_dither_observer.yaml: the observer's estimate (restarted after each disturbance
    window, which the controller node does not see) is the same in the controller node as in the evaluator, so the
    filtered torques are equal step for step."""
    filtered = []
    config, ros, ref = ros_and_evaluator("acrobot", "acrobot_dither_observer.yaml", "acrobot_hardware_proxy.npz",
                                         tmp_path, lambda supervisor: filtered.append(supervisor.mode))
    assert config.observer.enabled and filtered.count("lqr") >= 100
    for key in ("t", "x", "u", "u_cmd", "mode"):
        np.testing.assert_array_equal(ros[key], getattr(ref, key), err_msg=key)


@pytest.mark.parametrize("config_file", ["acrobot_dither_select_noisy.yaml", "acrobot_dither_select_phases.yaml"])
def test_ros_lockstep_run_equals_the_evaluator_with_the_selection_in_worker_processes(tmp_path, config_file):
    """The same with config/acrobot_dither_select_noisy.yaml (noisy finals, the observer, the delay simulated) and
    acrobot_dither_select_phases.yaml (with the dither's phase chosen and the start predicted over the delay from the
    node's last command): the controller node computes each decision in the file's two worker processes
    (``selection.workers``; the demo waits for a late one, as lockstep asks), the evaluator in its own process; the
    same policies run at the same steps."""
    selected = []
    config, ros, ref = ros_and_evaluator("acrobot", config_file,
                                         "acrobot_hardware_proxy_prior_catch.npz", tmp_path,
                                         lambda supervisor: selected.append(supervisor.selected))
    assert config.selection.workers == 2 and config.selection.noise_samples > 0
    assert len(set(selected)) >= 2                                    # another candidate than the loaded one ran
    for key in ("t", "x", "u", "u_cmd", "mode"):
        np.testing.assert_array_equal(ros[key], getattr(ref, key), err_msg=key)
