"""``mcpilco session --sim --robot-profile P --disturbance-from K``: the session's simulated robot is the profile's,
trial K on begin with a driver-run disturbance window (recorded, marked, kept from the model), and session.json
counts robot time (exploration + trials + windows) with the evaluation runs reported apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("rclpy")
from _ros_helpers import REPO  # noqa: E402

from mcpilco_core.config import ConfigError, load_robot_config  # noqa: E402
from mcpilco_core.evaluation import DisturbanceTargets  # noqa: E402
from mcpilco_core.learning.learner import trial_noise_seed  # noqa: E402
from mcpilco_core.recording import load_trial  # noqa: E402
from mcpilco_ros.sim_session import SessionOptions, SimSession, TrialRow  # noqa: E402

TINY = REPO / "config" / "train_tiny.yaml"

pytestmark = pytest.mark.timeout(300)   # a cold fresh clone under a full run once needed over 120 s


def test_session_on_a_profile_with_a_disturbance_trial_and_a_robot_check_counts_robot_time(tmp_path):
    out = tmp_path / "run"
    session = SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=out, trials=2, eval_seeds=(100,),
                                        eval_duration=5.0, quiet=True, robot_profile="hardware_proxy",
                                        disturbance_from=1, check=1, check_seconds=0.5, check_seed=7,
                                        protocol_seconds=2.0))
    result = session.run()
    assert session.nodes.procs == {} and all(p.poll() is not None for p in session.nodes.started)
    explore, learned = (np.load(out / "trials" / f"trial_{k:03d}.npz") for k in (0, 1))
    # the simulated robot of every trial is the profile's, its noise seeded per trial as the learner's
    assert str(explore["robot_profile"]) == str(learned["robot_profile"]) == "hardware_proxy"
    assert int(learned["seed"]) == trial_noise_seed(3, 1)
    # trial 0 explores without a window; trial 1 begins with one (100 steps), then its 1 s
    assert explore["disturbance_windows"].shape == (0, 2) and len(explore["u"]) == 1000
    np.testing.assert_array_equal(learned["disturbance_windows"], [[0, 100]])
    assert len(learned["u"]) == 600 and np.all(learned["mode"][:100] == 5) and np.all(learned["mode"][100:] != 5)
    assert np.all(learned["u"][100:, 1] == 0.0) and np.abs(learned["u"][:100, 1]).max() > 0.1
    seed = int(np.random.SeedSequence([3, 1, 2]).generate_state(1)[0])
    np.testing.assert_array_equal(learned["disturbance_targets"], [DisturbanceTargets(seed).next()])
    # the bag: the window's intervals never reach the model; session.yaml holds the driver's answer
    config = load_robot_config(REPO / "config" / "pendubot.yaml")
    trial = load_trial(out / "session" / "trial_001", config)
    # its 100 steps are the first 10 intervals; the state it handed over starts the 11th, which is data
    assert list(np.flatnonzero(trial.mode == "reset")) == list(range(10)) and not trial.valid[:10].any()
    assert trial.valid[10] and trial.mode[10] != "reset"
    info = yaml.safe_load((out / "session" / "session.yaml").read_text())
    assert "disturbance" not in info["trials"][0] and info["trials"][1]["disturbance"]["status"] == "accepted"
    # robot time: every simulated second of every trial, the window included; the evaluation apart
    rows = result["trials"]
    assert [r["robot_time_s"] for r in rows] == pytest.approx([2.0, 1.2])
    assert [r["window_s"] for r in rows] == pytest.approx([0.0, 0.2])
    assert rows[0]["disturbance"] is None and rows[1]["disturbance"]["target"] == info["trials"][1]["disturbance"][
        "target"]
    # + the robot check that chose the final policy (--check 1: the only retrained policy, 0.5 s of the protocol)
    assert result["robot_time_s"] == pytest.approx(3.7)
    assert result["robot_time_breakdown_s"] == pytest.approx({"exploration": 2.0, "trials": 1.0, "windows": 0.2,
                                                               "selection_check": 0.5, "total": 3.7})
    selection = json.loads((out / "selection.json").read_text())
    assert selection["robot_time_s"] == 0.5 and selection["robot_check"]["robot_profile"] == "hardware_proxy"
    assert selection["ranked_by"] == "protocol on the model"            # no robot time: a simulation of the model
    on_model = selection["protocol_on_model"]
    assert on_model["seconds_each"] == 2.0 and set(on_model["scores"]) == {"1"}
    assert selection["selected_trial"] == result["final_policy_trial"] == 1
    assert result["final_policy_chosen_by"] == "mcpilco select --check 1"
    assert (out / "policy.npz").read_bytes() == Path(rows[1]["policy"]).read_bytes()
    assert result["evaluation_time_s"] == 5.0 and rows[1]["eval_time_s"] == 5.0 and rows[0]["eval_time_s"] == 0.0
    assert result["robot_profile"] == "hardware_proxy" and result["disturbance_from"] == 1
    assert json.loads((out / "session.json").read_text())["robot_time_s"] == result["robot_time_s"]
    assert (out / "learning_curve.png").stat().st_size > 10_000


def _row(trial: int, robot_time: float, window: float = 0.0, eval_time: float = 0.0) -> TrialRow:
    return TrialRow(trial, "explore" if trial == 0 else "policy", "", "", [0.0] * 4, robot_time - window, {}, 0,
                    0.5, 1.0, robot_time_s=robot_time, window_s=window, eval_time_s=eval_time,
                    eval_score=None if trial == 0 else 0.1 * trial)


def test_robot_time_adds_up_and_the_curve_is_plotted_against_robot_seconds(tmp_path):
    from mcpilco_core.learning.retrain import plot_session_curve

    session = SimSession.__new__(SimSession)           # the accounting alone, without nodes
    session.rows = [_row(0, 3.0), _row(1, 3.2, 0.2, 60.0), _row(2, 3.2, 0.2, 60.0), _row(3, 3.0, 0.0, 60.0)]
    assert session.robot_time() == pytest.approx({"exploration": 3.0, "trials": 9.0, "windows": 0.4, "total": 12.4})
    path = plot_session_curve([vars(r) for r in session.rows], tmp_path / "curve.png", "test")
    assert path.stat().st_size > 10_000


def test_session_refuses_a_bad_profile_and_disturbance_from_before_starting_anything(tmp_path):
    with pytest.raises(ConfigError, match="hardware_proxi"):
        SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "a", trials=2,
                                  robot_profile="hardware_proxi"))
    with pytest.raises(ValueError, match="robot check"):
        SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "c", trials=2, check=2,
                                  check_seconds=0.0))
    with pytest.raises(ValueError, match="protocol on the model"):
        SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "d", trials=2, check=2,
                                  protocol_seconds=0.0))
    with pytest.raises(ValueError, match="--rank"):
        SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "e", trials=2, check=2,
                                  rank="best"))
    with pytest.raises(ValueError, match="disturbance-from"):
        SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "b", trials=2,
                                  disturbance_from=-1))
    assert not any((tmp_path / name).exists() for name in "abcde")


def test_cli_takes_robot_profile_and_disturbance_from():
    code = ("import sys; from mcpilco_ros.cli import build_parser; "
            "a = build_parser().parse_args(['session', '--sim', '--out', 'x', '--robot-profile', 'perturbed:2', "
            "'--disturbance-from', '3', '--check', '3', '--rank', 'cost']); "
            "assert (a.robot_profile, a.disturbance_from, a.check, a.check_seconds) == ('perturbed:2', 3, 3, 20.0), a; "
            "assert (a.rank, a.protocol_seconds) == ('cost', 60.0), a; "
            "assert 'rclpy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_selection_that_cannot_run_keeps_the_last_trials_policy_and_the_data(tmp_path, monkeypatch):
    from mcpilco_core.learning import selection

    def no_states(*args, **kwargs):
        raise ValueError("holds no post-disturbance states")

    monkeypatch.setattr(selection, "select_session_policy", no_states)
    session = SimSession.__new__(SimSession)           # the choice alone, without nodes
    session.o = SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path, check=2)
    session.out, session.profile_spec, said = tmp_path, "nominal", []
    session.say = said.append
    assert session.choose_final() is None
    assert "selection failed (holds no post-disturbance states)" in said[0]
    assert not (tmp_path / "selection.json").exists()
