"""controller_node and bad policy files (issue 13, items 1-3): every malformed file is refused with its name, at
start-up and on ``~/reload_policy``, the node keeps its policy and keeps controlling; a reload loads in a worker
thread, so control keeps publishing while a slow file is read, and the swap happens between two steps."""

from __future__ import annotations

import json
import math
import pickle
import threading

import numpy as np
import pytest

pytest.importorskip("rclpy")
from _ros_helpers import joint_state, rig, wait_for  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402
from test_ros_controller import connected, make_controller  # noqa: E402

import mcpilco_ros.controller_node as controller_module  # noqa: E402
from mcpilco_core.policy import SumOfGaussiansPolicy, load_policy, save_policy  # noqa: E402
from mcpilco_ros._ros_utils import ParameterError  # noqa: E402

pytestmark = pytest.mark.timeout(60)
FAR = (0.3, 0.0)   # far from upright: the policy acts


def good_policy(seed: int = 1) -> SumOfGaussiansPolicy:
    rng = np.random.default_rng(seed)
    return SumOfGaussiansPolicy(centers=rng.normal(size=(20, 6)), log_lengthscales=np.zeros(6),
                                weights=rng.normal(size=20), u_max=3.0, robot="pendubot")


def bad_files(folder) -> dict:
    """One file per trigger of issue 13: name -> path."""
    policy = good_policy()
    base = {"centers": policy.centers, "log_lengthscales": policy.log_lengthscales, "weights": policy.weights}
    meta = {"format": "mcpilco_policy", "format_version": 1, "robot": "pendubot", "u_max": 3.0,
            "control_period": 0.02, "feature_order": ["dq1", "dq2", "cos_q1", "cos_q2", "sin_q1", "sin_q2"]}
    files = {}
    for name, metadata in [("metadata_list", [1, 2]), ("version_text", {**meta, "format_version": "x"}),
                           ("feature_order", {**meta, "feature_order": 3})]:
        files[name] = folder / f"{name}.npz"
        np.savez(files[name], **base, metadata=np.array(json.dumps(metadata)))
    for name, value in [("strings", np.array(["a"], dtype=object)), ("dicts", np.array([{}], dtype=object))]:
        files[name] = folder / f"{name}.np"
        files[name].write_bytes(pickle.dumps({"centers": value, "log_lengthscales": np.zeros(6),
                                              "linear_weights": np.ones(1)}))
    slow = good_policy()
    slow.control_period = 0.5
    files["period"] = save_policy(slow, folder / "period.npz")
    nan = good_policy()
    nan.log_lengthscales[0] = -800.0
    files["nan_torque"] = save_policy(SumOfGaussiansPolicy(nan.centers, nan.log_lengthscales, nan.weights, 3.0,
                                                           "pendubot"), folder / "nan_torque.npz")
    return files


def policy_answers(peer) -> list:
    return [m for m in peer.received if m.header.frame_id == "policy"]


def test_every_malformed_file_is_refused_on_reload_and_the_node_keeps_controlling(tmp_path):
    first = save_policy(good_policy(), tmp_path / "first.npz")
    with rig() as r:
        controller, peer = connected(r, arm_on_start=True, policy=str(first))
        reload = peer.create_client(Trigger, "/controller_node/reload_policy")
        version = controller.policy_version
        stamp = 1_000_000
        for name, path in bad_files(tmp_path).items():
            controller.set_parameters([Parameter("policy", value=str(path))])
            answer = r.call(reload, Trigger.Request())
            assert not answer.success and str(path) in answer.message, (name, answer.message)
            assert controller.policy_version == version
            n = len(policy_answers(peer))
            peer.pub.publish(joint_state(FAR, stamp_ns=stamp))   # still controlling, with the old policy
            stamp += 20_000_000
            wait_for(lambda n=n: len(policy_answers(peer)) == n + 1, what=f"a policy command after {name}")
            assert all(math.isfinite(u) for u in policy_answers(peer)[-1].effort)


@pytest.mark.parametrize("name", ["metadata_list", "version_text", "feature_order", "strings", "dicts", "period",
                                  "nan_torque"])
def test_a_malformed_file_at_start_up_is_a_parameter_error_naming_it(tmp_path, name):
    path = bad_files(tmp_path)[name]
    with rig() as r, pytest.raises(ParameterError, match=str(path.name)):
        make_controller(r.context, policy=str(path))


def test_control_keeps_publishing_during_a_slow_reload_and_the_swap_waits_for_it(tmp_path, monkeypatch):
    first = save_policy(good_policy(1), tmp_path / "first.npz")
    second = save_policy(good_policy(2), tmp_path / "second.npz")
    started, release = threading.Event(), threading.Event()

    def slow_load(*args, **kwargs):   # stands for a slow disk: blocks until the test has seen control go on
        started.set()
        assert release.wait(20.0)
        return load_policy(*args, **kwargs)

    with rig() as r:
        controller, peer = connected(r, arm_on_start=True, policy=str(first))
        monkeypatch.setattr(controller_module, "load_policy", slow_load)
        reload = peer.create_client(Trigger, "/controller_node/reload_policy")
        assert reload.wait_for_service(timeout_sec=10.0)
        old = controller.policy_version
        controller.set_parameters([Parameter("policy", value=str(second))])
        future = reload.call_async(Trigger.Request())
        wait_for(started.is_set, what="the reload started")
        for k in range(5):   # the load is blocked: every state still gets its command, from the old policy
            peer.pub.publish(joint_state(FAR, stamp_ns=1_000_000 + k * 20_000_000))
            wait_for(lambda k=k: len(policy_answers(peer)) == k + 1, what=f"command {k} during the load")
        assert not future.done() and controller.policy_version == old
        second_try = r.call(reload, Trigger.Request())   # one load at a time
        assert not second_try.success and "in progress" in second_try.message
        release.set()
        wait_for(future.done, what="the reload answer")
        assert future.result().success, future.result().message
        assert controller.policy_version == load_policy(second).version() != old
