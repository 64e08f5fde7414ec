"""sim_driver_node in-process: 500 Hz joint_states, torque limits and the passive joint's zero, stale
commands, ~/stop, and the deterministic lockstep clock."""

from __future__ import annotations

import math
import time

import pytest

pytest.importorskip("rclpy")
from _ros_helpers import CONFIG, Peer, joint_state, rig, wait_for  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.plant import DoublePendulum  # noqa: E402
from mcpilco_ros._ros_utils import ParameterError, stamp_ns  # noqa: E402
from mcpilco_ros.sim_driver_node import SimDriverNode  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def make_sim(context, robot: str = "pendubot", **overrides) -> SimDriverNode:
    params = {"diagnostics_period": 0.1, **overrides}
    return SimDriverNode(context=context, cli_args=["--ros-args", "--params-file", str(CONFIG / f"{robot}.yaml")],
                         parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])


def connected(r, **overrides):
    sim = r.add(make_sim(r.context, **overrides))
    peer = r.add(Peer(r.context, "joint_commands", "joint_states"))
    r.start()
    wait_for(lambda: peer.pub.get_subscription_count() >= 1 and sim.state_pub.get_subscription_count() >= 1,
             what="simulated robot and test peer matched")
    return sim, peer


def command(effort, stamp: int = 0, names=("shoulder", "elbow")):
    msg = joint_state(stamp_ns=stamp, names=names, q=(), dq=(), effort=effort)
    return msg


def test_realtime_rate_limits_passive_zero_stale_and_stop():
    with rig() as r:
        sim, peer = connected(r, mode="realtime", command_timeout=0.05)
        wait_for(lambda: len(peer.received) >= 250, what="250 joint_states")
        # order and content, not rate (the real-time rate is measured by benchmarks/bench_ros_latency.py): every
        # state is newer than the one before and names both joints
        received = list(peer.received)
        stamps = [stamp_ns(m) for m in received]
        assert all(b > a for a, b in zip(stamps, stamps[1:]))
        assert all(list(m.name) == ["shoulder", "elbow"] and len(m.position) == len(m.velocity) == 2 for m in received)

        def pushing(effort):
            def predicate():
                peer.pub.publish(command(effort))
                return True
            return predicate

        # 100 N m on the shoulder and 7 on the passive elbow: 6 and exactly 0 reach the plant
        def applied_is(target):
            def predicate():
                peer.pub.publish(command((100.0, 7.0)))
                return tuple(peer.received[-1].effort) == target
            return predicate

        wait_for(applied_is((6.0, 0.0)), what="clipped torque applied")
        # commands stop: stale after command_timeout (0.05 s; 1 s allowed on a loaded machine) -> zero torque
        wait_for(lambda: tuple(peer.received[-1].effort) == (0.0, 0.0), timeout=1.0, what="stale command zeroed")
        assert sim.counters["stale_steps"] > 0
        # wrong names or NaN never reach the plant
        for _ in range(3):
            peer.pub.publish(command((1.0, 0.0), names=("hip", "knee")))
            peer.pub.publish(command((math.nan, 0.0)))
        wait_for(lambda: sim.counters["refused_names"] == 3 and sim.counters["refused_nonfinite"] == 3,
                 what="refused commands counted")
        assert tuple(peer.received[-1].effort) == (0.0, 0.0)
        # ~/stop latches zero torque even while commands keep coming
        stop = peer.create_client(Trigger, "/sim_driver_node/stop")
        assert r.call(stop, Trigger.Request()).success
        count = len(peer.received)
        wait_for(lambda: pushing((3.0, 0.0))() and len(peer.received) > count + 50, what="50 states after stop")
        assert all(tuple(m.effort) == (0.0, 0.0) for m in peer.received[count + 5:])


def test_acrobot_passive_shoulder_gets_zero():
    with rig() as r:
        sim, peer = connected(r, robot="acrobot", mode="realtime")

        def applied():
            peer.pub.publish(command((5.0, -50.0)))
            return tuple(peer.received[-1].effort) == (0.0, -6.0) if peer.received else False

        wait_for(applied, what="acrobot: elbow clipped, shoulder zero")


def test_lockstep_steps_once_per_answer_and_falls_back_on_timeout():
    x0 = (0.5, -0.3, 1.0, 0.0)
    with rig() as r:
        sim, peer = connected(r, mode="lockstep", initial_state=list(x0), lockstep_timeout=0.3)
        wait_for(lambda: len(peer.received) >= 1, what="state 0")
        assert stamp_ns(peer.received[0]) == 0 and tuple(peer.received[0].position) == x0[:2]
        peer.pub.publish(command((1.0, 0.0), stamp=1_000_000))     # answers no state: ignored
        wait_for(lambda: sim.counters["unmatched_commands"] == 1, what="unmatched command")
        assert sim.k == 0

        peer.pub.publish(command((1.5, 0.4), stamp=0))
        wait_for(lambda: any(stamp_ns(m) == 2_000_000 for m in peer.received), what="state 1")
        state1 = next(m for m in peer.received if stamp_ns(m) == 2_000_000)
        plant = DoublePendulum(load_robot_config(CONFIG / "pendubot.yaml").plant)
        expected = plant.rk4_step_scalar(x0, (1.5, 0.0), 0.002)   # passive elbow's 0.4 dropped
        assert tuple(state1.position) + tuple(state1.velocity) == expected
        assert tuple(state1.effort) == (1.5, 0.0)
        # nobody answers state 1: after lockstep_timeout the robot steps on with zero torque
        wait_for(lambda: sim.counters["lockstep_timeouts"] >= 1, what="lockstep timeout fallback")
        wait_for(lambda: any(stamp_ns(m) == 4_000_000 for m in peer.received), what="state 2")
        assert tuple(next(m for m in peer.received if stamp_ns(m) == 4_000_000).effort) == (0.0, 0.0)


def test_lockstep_waits_for_the_first_answer_and_republishes_a_late_one_for_lockstep_timeout():
    """Lockstep never steps before the first answer (the controller may still be starting), however long that takes;
    after it, an unanswered state is re-published every 50 ms and only lockstep_timeout s after it went out does the
    robot step on with zero torque."""
    with rig() as r:
        sim, peer = connected(r, mode="lockstep", lockstep_timeout=0.5)
        wait_for(lambda: len(peer.received) >= 1, what="state 0")
        time.sleep(1.2)                                             # more than twice lockstep_timeout: no answer yet
        assert sim.k == 0 and sim.counters["lockstep_timeouts"] == 0
        assert len(peer.received) >= 3 and {stamp_ns(m) for m in peer.received} == {0}    # state 0, re-published

        sent = time.monotonic()
        peer.pub.publish(command((1.0, 0.0), stamp=0))              # the first answer: state 1, then nobody answers
        wait_for(lambda: sim.counters["lockstep_timeouts"] == 1, what="lockstep timeout fallback")
        assert time.monotonic() - sent >= 0.5                       # not before lockstep_timeout
        assert sim.counters["republished"] >= 1
        assert sum(stamp_ns(m) == 2_000_000 for m in peer.received) >= 2    # state 1 went out again meanwhile


@pytest.mark.parametrize("overrides, parameter", [
    ({"mode": "fast"}, "mode"),
    ({"initial_state": [0.0, 0.0, 0.0]}, "initial_state"),
    ({"command_timeout": 0.0}, "command_timeout"),
    ({"torque_limit": -2.0}, "torque_limit"),
    ({"robot_profile": "hardware_proxi"}, "robot_profile"),
])
def test_invalid_sim_parameters_are_refused(overrides, parameter):
    with rig() as r:
        with pytest.raises(ParameterError, match=f"parameter '{parameter}'"):
            make_sim(r.context, **overrides)


def test_robot_profile_publishes_what_its_sensors_measure():
    """hardware_proxy: the published state is the delayed, noisy measurement (seeded by protocol.seed), the
    torque passes the motor lag; the passive joint still gets exactly 0."""
    with rig() as r:
        sim, peer = connected(r, mode="lockstep", robot_profile="hardware_proxy", initial_state=[0.3, 0.0, 0.0, 0.0])
        assert sim.profile.name == "hardware_proxy" and sim.robot.plant.params.name == "model_1.0"
        wait_for(lambda: len(peer.received) >= 1, what="state 0")
        first = peer.received[0]
        assert tuple(first.position) == (0.3, 0.0) and tuple(first.velocity) != (0.0, 0.0)   # velocity noise
        peer.pub.publish(command((2.0, 5.0), stamp=0))
        wait_for(lambda: any(stamp_ns(m) == 2_000_000 for m in peer.received), what="state 1")
        state1 = next(m for m in peer.received if stamp_ns(m) == 2_000_000)
        assert state1.effort[1] == 0.0 and state1.effort[0] != 2.0 and abs(state1.effort[0] - 1.8) < 0.1
        assert tuple(state1.position) == (0.3, 0.0)    # 5 ms delay: still the initial state's positions


@pytest.mark.parametrize("answer_final", [True, False])
def test_lockstep_publishes_the_final_state_and_exits_once_it_is_answered(answer_final, monkeypatch, tmp_path):
    """duration 4 ms (2 steps): the state at duration goes out too (the end of the last interval); its answer
    moves nothing and is not an unmatched command, and ends the process; unanswered, it ends after the wait.
    The record file names that state's stamp (a session waits until the trainer has recorded it)."""
    import numpy as np

    from mcpilco_ros import sim_driver_node

    monkeypatch.setattr(sim_driver_node, "FINAL_STATE_WAIT", 30.0 if answer_final else 0.3)   # answered: the
    # answer alone ends it
    record = tmp_path / "trial.npz"
    with rig() as r:
        sim, peer = connected(r, mode="lockstep", duration=0.004, exit_when_done=True, record_file=str(record))
        for k in range(2):
            wait_for(lambda k=k: any(stamp_ns(m) == k * 2_000_000 for m in peer.received), what=f"state {k}")
            peer.pub.publish(command((0.5, 0.0), stamp=k * 2_000_000))
        wait_for(lambda: any(stamp_ns(m) == 4_000_000 for m in peer.received), what="the final state")
        assert sim.finished and sim.k == 2 and not sim.done.is_set()
        if answer_final:
            peer.pub.publish(command((0.5, 0.0), stamp=4_000_000))
        wait_for(lambda: sim.done.is_set(), timeout=5, what="exit after the final state")
        assert sim.k == 2 and sim.counters["unmatched_commands"] == 0 and sim.counters["lockstep_timeouts"] == 0
    with np.load(record) as data:
        assert int(data["final_state_stamp_ns"]) == 4_000_000 and len(data["u"]) == 2
