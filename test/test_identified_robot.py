"""The robot as the learner identifies it at the state rate (gp.identify_robot; learning/identified_robot.py): from
a 3 s exploration trial on the hardware proxy it finds the proxy's friction, rotor inertia, sensor delay, motor lag
and noise; a bag gives the same recording as the simulated trial; the learner keeps the identified robot with its
model and its protocol simulations (the snapshot judge, ``mcpilco select``) run on it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_selection import tiny_run

from mcpilco_core.config import load_plant_parameters
from mcpilco_core.control import build_controller
from mcpilco_core.control.exploration import ExplorationController
from mcpilco_core.evaluation import evaluate_seed
from mcpilco_core.learning.identified_robot import IdentifiedRobot, identify_robot
from mcpilco_core.learning.learner import load_train_config, run_on_robot, state_recording
from mcpilco_core.learning.model import DynamicsModel
from mcpilco_core.learning.protocol import on_model
from mcpilco_core.learning.runs import RunDirectory, train
from mcpilco_core.learning.selection import ModelProtocol, select_policy
from mcpilco_core.policy import load_policy
from mcpilco_core.recording.state_rate import recording_from_bag

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(240)


def exploration(config, profile: str, seed: int, seconds: float = 3.0):
    explorer = ExplorationController(config, 3.0, np.random.default_rng(seed))
    return run_on_robot(config, explorer, np.zeros(4), seconds, profile, seed)


def recording(config, profile: str, seed: int):
    """An exploration trial at the state rate, as its bag gives it."""
    return state_recording(exploration(config, profile, seed), config)


def test_the_proxys_friction_delay_lag_and_noise_come_back_from_one_exploration_trial(pendubot_config, repo):
    proxy = load_plant_parameters(repo / "config" / "plant_models.yaml", "model_1.0")
    found = identify_robot(pendubot_config.plant, [recording(pendubot_config, "hardware_proxy", 1)],
                           actuated=0, torque_limit=pendubot_config.torque_limit)
    assert found is not None and found.delay_steps == 2             # 5 ms at 2 ms steps: the state 2 steps old
    assert found.plant.cf == pytest.approx(proxy.cf, rel=0.06) and found.plant.Ir == pytest.approx(proxy.Ir, rel=0.1)
    assert found.motor_responsiveness == pytest.approx(0.9, abs=0.01)
    assert found.measurement_noise[2:] == pytest.approx((0.05, 0.05), rel=0.1)
    assert max(found.measurement_noise[:2]) < 1e-3                 # the proxy's positions are exact
    assert found.torque_noise == pytest.approx(0.02, rel=0.15)
    profile = found.profile()
    assert int(profile.delay / 0.002) == 2 and profile.motor_responsiveness == found.motor_responsiveness
    # the nominal robot is its prior: no friction, no delay, no lag, no noise
    ideal = identify_robot(pendubot_config.plant, [recording(pendubot_config, "nominal", 1)], 0,
                           pendubot_config.torque_limit)
    assert ideal.delay_steps == 0 and ideal.motor_responsiveness == pytest.approx(1.0, abs=1e-6)
    assert max(ideal.plant.cf) < 0.01 and max(ideal.measurement_noise) < 1e-3 and ideal.torque_noise < 1e-6
    assert identify_robot(pendubot_config.plant, [], 0, 6.0) is None                       # nothing to learn from


def test_a_bag_gives_the_recording_of_the_simulated_trial(pendubot_config):
    """The bag's streams as the reader gives them: effort[j] acted over the step ending at state j, each command
    stamped with the state it answers; a reset-marked state and a gap make their steps unusable."""
    traj = exploration(pendubot_config, "hardware_proxy", 2, 0.2)
    direct = state_recording(traj, pendubot_config)
    n = len(traj.u)
    stamps = np.arange(n + 1, dtype=np.int64) * 2_000_000
    effort = np.vstack([np.zeros(2), traj.u])                       # state 0 carries the torque before the trial
    x = traj.extras["x_measured"]
    reset = np.zeros(n + 1, bool)
    reset[40] = True
    stamps[70:] += 1_000_000                                        # the stream stalls once
    bag = recording_from_bag(stamps, x[:, :2], x[:, 2:], effort, stamps[:-1], traj.u_cmd, reset)
    assert np.array_equal(bag.x, direct.x) and np.array_equal(bag.effort, direct.effort)
    assert np.array_equal(bag.command, direct.command)
    assert not bag.valid[39] and not bag.valid[40] and not bag.valid[69] and bag.valid[[38, 41, 68, 70]].all()
    assert recording_from_bag(stamps, x[:, :2], x[:, 2:], np.zeros((0, 2)), stamps[:-1], traj.u_cmd, reset) is None


def test_the_identified_robot_is_saved_with_the_model_and_the_protocol_runs_on_it(pendubot_config, repo):
    found = identify_robot(pendubot_config.plant, [recording(pendubot_config, "hardware_proxy", 3)],
                           0, pendubot_config.torque_limit)
    model = DynamicsModel(pendubot_config)
    model.robot = found
    again = DynamicsModel(pendubot_config)
    assert IdentifiedRobot.from_arrays(pendubot_config.plant, found.to_arrays()) == found
    assert IdentifiedRobot.from_arrays(pendubot_config.plant, {}) is None and again.robot is None

    @dataclasses.dataclass
    class Run:
        robot: object

    robot, profile = on_model(Run(pendubot_config), model)
    assert robot.plant == found.plant and profile.delay == found.delay and profile.seed != 0   # its own noise
    model.robot = None
    robot, profile = on_model(Run(pendubot_config), model)
    assert robot.plant == model.config.plant and profile == "nominal"


@pytest.fixture(scope="module")
def proxy_run(tmp_path_factory) -> Path:
    """A finished 3-trial run on the hardware proxy with gp.identify_robot and the snapshot judge."""
    return tiny_run(tmp_path_factory.mktemp("identified"), robot_config=str(REPO / "config" / "pendubot_dither.yaml"),
                    robot_profile="hardware_proxy", trials=3, exploration={"duration": 1.0, "amplitude": 3.0},
                    gp={"fit_steps": 3, "fit_points": 30, "max_points": 20, "identify": True, "identify_robot": True},
                    optimizer={"max_steps_first": 4, "max_steps": 4, "patience": 4, "smoothing": 0.9,
                               "snapshot_every": 2, "snapshot_seeds": [3000], "snapshot_seconds": 1.0})


def test_the_learner_identifies_the_robot_and_judges_its_snapshots_there(proxy_run):
    run = RunDirectory(proxy_run)
    config = run.load_config()
    record = run.load_trial(2, config.robot.robot)
    summary = record.summary()
    steps, dt, r = summary["identified_robot"]["sensors_motors"][:3]
    assert steps == 2 and dt == pytest.approx(0.002) and r == pytest.approx(0.9, abs=0.02)
    model = DynamicsModel(config.model_robot, config.gp)
    model.load_arrays(record.model_arrays)
    assert model.robot is not None and model.robot.delay_steps == 2
    # trial 2's judge scored its kept policy on the identified robot of trial 2's model
    kept = [score for step, score in record.optimization.snapshots if step == record.optimization.kept_step][0]
    robot, profile = on_model(config, model)
    controller = build_controller(config.robot, record.policy)
    assert evaluate_seed(controller, robot, 3000, 1.0, False, profile).score == pytest.approx(kept, abs=1e-12)
    assert "delay 2 steps (the state 4 ms old)" in (proxy_run / "log.txt").read_text()   # every trial's line


def test_select_ranks_on_the_identified_robot_or_on_the_plant_as_asked(proxy_run, tmp_path):
    identified = select_policy(proxy_run, particles=20, seed=1, protocol=ModelProtocol((5,), 1.0))
    plant = select_policy(proxy_run, particles=20, seed=1, protocol=ModelProtocol((5,), 1.0, "plant"))
    report = identified.to_dict()["protocol_on_model"]
    assert report["robot"] == "model" and report["plant"]["identified_robot"]["delay_steps"] == 2
    assert "identified_robot" not in plant.to_dict()["protocol_on_model"]["plant"]
    config = RunDirectory(proxy_run).load_config()
    model = DynamicsModel(config.model_robot, config.gp)
    model.load_arrays(RunDirectory(proxy_run).load_trial(2, config.robot.robot).model_arrays)
    k = identified.ranked()[0]
    controller = build_controller(config.robot, load_policy(identified.files[k]))
    robot, profile = on_model(config, model)
    assert identified.protocol_scores[k] == evaluate_seed(controller, robot, 5, 1.0, False, profile).score
    ideal = dataclasses.replace(config.robot, plant=model.config.plant)
    assert plant.protocol_scores[k] == evaluate_seed(controller, ideal, 5, 1.0, False, "nominal").score
    with pytest.raises(ValueError, match="robot must be one of"):
        ModelProtocol((5,), 1.0, "proxy")


def test_identifying_the_robot_leaves_the_training_as_it_was(proxy_run, tmp_path):
    """Without the snapshot judge nothing in training reads the identified robot, and the identification draws
    from its own generator: the same run with and without it learns the same policies."""
    data = yaml.safe_load((proxy_run.parent / "train.yaml").read_text())
    data["trials"] = 2
    data["optimizer"]["snapshot_every"] = 0
    policies = []
    for identify in (True, False):
        data["gp"]["identify_robot"] = identify
        (tmp_path / f"t{identify}.yaml").write_text(yaml.safe_dump(data))
        train(load_train_config(tmp_path / f"t{identify}.yaml"), tmp_path / f"run{identify}")
        policies.append(load_policy(tmp_path / f"run{identify}" / "trials" / "trial_001" / "policy.npz"))
    assert np.array_equal(policies[0].weights, policies[1].weights)
    assert np.array_equal(policies[0].centers, policies[1].centers)


def test_mcpilco_identify_prints_the_robot_and_writes_a_design_robot(proxy_run, tmp_path, capsys):
    from mcpilco_core.simulation import load_robot_profile
    from mcpilco_ros import cli

    out = tmp_path / "design" / "mine.yaml"
    assert cli.main(["identify", str(proxy_run), "--trials", "0", "--write", str(out)]) == 0
    assert "delay 2 steps" in capsys.readouterr().out
    profile = load_robot_profile(out)
    config = RunDirectory(proxy_run).load_config()
    assert profile.imperfections(config.robot).delay_steps(0.002) == 2
    assert profile.motor_responsiveness == pytest.approx(0.9, abs=0.01)
    assert profile.plant_parameters(config.robot).cf == pytest.approx((0.16, 0.12), rel=0.1)
    second = tmp_path / "design" / "other.yaml"                        # a second robot joins the same models file
    assert cli.main(["identify", str(proxy_run), "--write", str(second)]) == 0
    assert load_robot_profile(second).plant_model == "identified_other"
    assert load_robot_profile(out).plant_model == "identified_mine"
    assert cli.main(["identify", str(proxy_run), "--write", str(out)]) == 2   # never replaces a file
    assert "exists" in capsys.readouterr().err
    assert cli.main(["identify", str(tmp_path / "nothing")]) == 2
    assert cli.main(["identify", str(proxy_run), "--trials", "-2"]) == 2
    assert "--trials must be >= 0" in capsys.readouterr().err
    for bad in ("my: robot.yaml", "robot.txt"):                        # its name becomes a YAML key: refused
        assert cli.main(["identify", str(proxy_run), "--write", str(tmp_path / "design" / bad)]) == 2
        assert "name the profile with" in capsys.readouterr().err
    assert load_robot_profile(second).plant_model == "identified_other"  # the models file untouched


def test_a_models_file_that_does_not_end_in_its_models_is_left_as_it_was(proxy_run, tmp_path, capsys):
    from mcpilco_ros import cli

    models = tmp_path / "plant_models.yaml"
    text = "models:\n  other: {m: [1, 1], l: [1, 1], r: [1, 1], I: [2, 2]}\nnotes: a key after the models\n"
    models.write_text(text)
    assert cli.main(["identify", str(proxy_run), "--write", str(tmp_path / "mine.yaml")]) == 2
    assert models.read_text() == text and not (tmp_path / "mine.yaml").exists()
    models.write_text("models: [unclosed\n")                        # a models file that is not YAML: a clear error
    assert cli.main(["identify", str(proxy_run), "--write", str(tmp_path / "mine.yaml")]) == 2
    assert "not valid YAML" in capsys.readouterr().err


@pytest.mark.parametrize("responsiveness", [1.0, 0.9])
def test_a_delayed_robots_transition_needs_the_previous_command(pendubot_config, repo, responsiveness):
    """On a robot whose sensors are 2 steps late, the 20 ms transition from a measured state depends on the previous
    command: with it (delayed_velocities) the true plant predicts the noise-free trial to float precision (r = 1) or
    to the motor lag's leftover (r = 0.9: the applied torque starts at the previous command, not where the lag left
    it), while holding the torque over the period (the GP's prior) misses by far more."""
    from mcpilco_core.learning.identification import predicted_velocities
    from mcpilco_core.learning.identified_robot import delayed_velocities
    from mcpilco_core.learning.learner import learning_transitions
    from mcpilco_core.simulation import RobotProfile

    plant = load_plant_parameters(repo / "config" / "plant_models.yaml", "model_1.0")
    profile = RobotProfile(name="late", plant_model="model_1.0", plant_models_file=str(repo / "config" /
                           "plant_models.yaml"), delay=0.005, motor_responsiveness=responsiveness)
    data = learning_transitions(exploration(pendubot_config, profile, 3, seconds=2.0), pendubot_config)
    previous = data.u_prev
    assert previous[0] == 0.0 and np.array_equal(previous[1:], data.u[:-1])   # motor off before, then the one before
    held = predicted_velocities(plant, data, 0.02, 0) - data.x_next[:, 2:]
    predicted = delayed_velocities(plant, data.x, data.u, previous, 0.02, 0.002, 0, 2, responsiveness)
    delayed = predicted - data.x_next[:, 2:]
    assert np.sqrt(np.mean(held ** 2)) > 0.05                     # rad/s
    assert np.sqrt(np.mean(delayed ** 2)) < (1e-6 if responsiveness == 1.0 else 0.1 * np.sqrt(np.mean(held ** 2)))
    robot = IdentifiedRobot(plant, 2, 0.002, responsiveness, (0.0, 0.0, 0.0, 0.0), 0.0, (0.0, 0.0), 1)
    assert np.array_equal(robot.transition_velocities(data.x, data.u, previous, 0.02, 0), predicted)


def test_the_motor_lag_starts_from_the_previous_command(repo):
    """delayed_velocities: the applied torque starts at the previous command and follows the commands (the previous
    one for ``delay_steps`` steps, then the new one) through applied += r (command - applied)."""
    from mcpilco_core.learning.identified_robot import delayed_velocities
    from mcpilco_core.plant import DoublePendulum

    plant = load_plant_parameters(repo / "config" / "plant_models.yaml", "model_1.0")
    x = np.array([[0.3, -0.2, 1.0, 0.5], [2.0, 0.4, -1.0, 3.0]])
    u, previous = np.array([2.0, -3.0]), np.array([-1.0, 1.5])
    expected, applied = x.copy(), previous.copy()
    for j in range(10):
        applied = applied + 0.5 * ((previous if j < 1 else u) - applied)
        expected = DoublePendulum(plant).rk4_step(expected, np.stack([applied, np.zeros(2)], -1), 0.002)
    got = delayed_velocities(plant, x, u, previous, 0.02, 0.002, 0, 1, 0.5)
    np.testing.assert_allclose(got, expected[:, 2:], rtol=0, atol=1e-12)


def velocity_error(plant, truth, actuated: int, seed: int = 1) -> np.ndarray:
    """RMS error (rad/s, per joint) of ``plant``'s velocities 20 ms after random states and torques on the
    ``actuated`` joint, against ``truth``'s."""
    from mcpilco_core.plant import DoublePendulum

    rng = np.random.default_rng(seed)
    x0 = np.column_stack([rng.uniform(-np.pi, np.pi, (500, 2)), rng.normal(0.0, 4.0, (500, 2))])
    u = np.zeros((500, 2))
    u[:, actuated] = rng.uniform(-6.0, 6.0, 500)
    ends = []
    for params in (plant, truth):
        model, x = DoublePendulum(params), x0.copy()
        for _ in range(10):
            x = model.rk4_step(x, u, 0.002)
        ends.append(x[:, 2:])
    return np.sqrt(np.mean((ends[0] - ends[1]) ** 2, axis=0))


def test_with_mechanics_scales_the_links_and_keeps_each_inertia_at_least_the_point_masss(pendubot_config):
    from mcpilco_core.learning.identified_robot import with_mechanics

    prior = pendubot_config.plant
    plant = with_mechanics(prior, np.array([1.1, 0.9, 1.2, 0.8, 1.0, 0.5]))
    assert plant.m == pytest.approx((prior.m[0] * 1.1, prior.m[1] * 0.9))
    assert plant.r == pytest.approx((prior.r[0] * 1.2, prior.r[1] * 0.8))
    assert plant.I[0] == pytest.approx(max(prior.I[0], plant.m[0] * plant.r[0] ** 2))
    assert plant.I[1] == pytest.approx(max(prior.I[1] * 0.5, plant.m[1] * plant.r[1] ** 2))
    assert plant.l == prior.l and plant.cf == prior.cf and plant.Ir == prior.Ir


def test_the_mechanics_of_a_robot_with_other_links_come_back_from_one_exploration_trial(repo):
    """``mechanics``: on an acrobot whose links differ from the prior's (``perturbed:2``: every parameter within
    10 %), fitting the masses, centres of mass and inertias as well makes the identified plant move as the robot does
    where friction alone cannot; on the prior's own robot the fit leaves the plant as it is."""
    from mcpilco_core.config import load_robot_config
    from mcpilco_core.simulation import load_robot_profile

    config = load_robot_config(repo / "config" / "acrobot.yaml")
    truth = load_robot_profile("perturbed:2").plant_parameters(config)
    trial = [recording(config, "perturbed:2", 1)]
    friction_only = identify_robot(config.plant, trial, 1, config.torque_limit)
    mechanics = identify_robot(config.plant, trial, 1, config.torque_limit, mechanics=True)
    before, after = velocity_error(friction_only.plant, truth, 1), velocity_error(mechanics.plant, truth, 1)
    assert np.all(after < 0.6 * before), (before, after)
    assert friction_only.plant.m == config.plant.m and mechanics.plant.m != config.plant.m
    assert mechanics.plant.l == config.plant.l and mechanics.delay_steps == friction_only.delay_steps == 2
    ideal = identify_robot(config.plant, [recording(config, "nominal", 1)], 1, config.torque_limit, mechanics=True)
    assert max(velocity_error(ideal.plant, config.plant, 1)) < 0.01


def test_mcpilco_identify_mechanics_prints_and_writes_the_fitted_links(proxy_run, tmp_path, capsys):
    from mcpilco_core.simulation import load_robot_profile
    from mcpilco_ros import cli

    out = tmp_path / "design" / "links.yaml"
    assert cli.main(["identify", str(proxy_run), "--trials", "0", "--mechanics", "--write", str(out)]) == 0
    printed = capsys.readouterr().out
    config = RunDirectory(proxy_run).load_config()
    lengths = config.model_robot.plant.l
    assert "mechanics: m " in printed and f"lengths {lengths[0]:g} / {lengths[1]:g} m, the prior's" in printed
    assert "measure the robot's" in printed
    written = load_robot_profile(out).plant_parameters(config.robot)
    masses = printed.split("mechanics: m ")[1].split(" kg")[0]
    assert masses == f"{written.m[0]:.4g} / {written.m[1]:.4g}" and written.l == config.model_robot.plant.l
