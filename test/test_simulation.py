"""The simulated robot: limits, the passive joint, overrides, and RealAIGym's delay, noise and motor lag on
hand-computed steps."""

import numpy as np
import pytest
import yaml

from mcpilco_core.config import ConfigError
from mcpilco_core.plant import GOAL, DoublePendulum
from mcpilco_core.simulation import (
    MODE_CODES,
    Imperfections,
    SimulatedRobot,
    Simulator,
    load_robot_profile,
    simulated_time,
)


class Greedy:
    """A controller that asks for too much torque on both joints (and NaN every 7th step)."""

    mode = "policy"

    def __init__(self):
        self.seen = []

    def reset(self):
        self.seen.clear()

    def step(self, x, t):
        self.seen.append(np.array(x))
        if len(self.seen) % 7 == 0:
            return np.array([np.nan, 1.0])
        return np.array([50.0, -50.0])


def test_limits_and_passive_joint(pendubot_plant):
    sim = Simulator(pendubot_plant, (6.0, 0.0))
    controller = Greedy()
    traj = sim.run(controller, np.zeros(4), 0.1)
    assert np.all(traj.u[:, 1] == 0.0)                      # the passive joint never gets torque
    assert np.all(np.abs(traj.u[:, 0]) <= 6.0)
    assert np.all(traj.u[6::7] == 0.0)                      # a non-finite command never reaches the plant
    assert np.max(np.abs(traj.u_cmd[:, 1])) == 50.0         # ...but what was asked is recorded
    assert np.all(traj.mode == MODE_CODES["policy"])
    assert traj.x.shape == (51, 4) and traj.u.shape == (50, 2)


class Upright:
    """Zero torque; the robot starts upright and at rest, so it is above the line for the whole (short) run."""

    mode = "policy"

    def reset(self):
        pass

    def step(self, x, t):
        return np.zeros(2)


def test_the_score_is_over_the_time_simulated(pendubot_plant):
    sim = Simulator(pendubot_plant, (6.0, 0.0))
    odd = sim.run(Upright(), np.array(GOAL), 0.003)           # 0.003 s at 2 ms: 2 steps, 0.004 s simulated
    assert odd.x.shape == (3, 4) and odd.score == pytest.approx(1.0)   # was 1.333: 0.004 s up over 0.003 s
    assert sim.run(Upright(), np.array(GOAL), 0.02).score == pytest.approx(1.0)
    assert simulated_time(60.0, 0.002) == (30000, 60.0)       # the protocol's 60 s: divided by 60 exactly
    assert simulated_time(0.003, 0.002) == (2, 0.004)


def test_override_takes_over(pendubot_plant):
    sim = Simulator(pendubot_plant, (6.0, 0.0))
    traj = sim.run(Greedy(), np.zeros(4), 0.02, override=lambda k, t, x: np.array([10.0, -10.0]) if k < 5 else None)
    assert np.all(traj.mode[:5] == MODE_CODES["reset"]) and np.all(traj.u[:5] == [6.0, -6.0])
    assert np.all(traj.mode[5:] == MODE_CODES["policy"])


class Recorder:
    """Sends a fixed torque sequence and records what it was shown."""

    mode = "policy"

    def __init__(self, commands):
        self.commands = commands
        self.seen = []

    def reset(self):
        self.seen.clear()

    def step(self, x, t):
        self.seen.append(np.array(x))
        return self.commands[len(self.seen) - 1]


def test_delay_noise_and_lag_follow_the_formulas(pendubot_plant):
    """delay 5 ms at 2 ms: the state 2 steps old (n = int(0.005/0.002) + 1 = 3); noise added to it; torque
    u = u_last + r (u_cmd - u_last), plus noise, then the limits (the passive joint's is 0)."""
    imperfections = Imperfections(measurement_noise=(0.01, 0.02, 0.05, 0.06), delay=0.005,
                                  motor_responsiveness=0.9, torque_noise=(0.02, 0.5))
    commands = [np.array([1.0, 3.0]), np.array([2.0, 0.0]), np.array([-8.0, 0.0]), np.array([0.5, 0.0]),
                np.array([0.5, 0.0]), np.array([0.5, 0.0])]
    controller = Recorder(commands)
    sim = Simulator(pendubot_plant, (6.0, 0.0), imperfections=imperfections, rng=np.random.default_rng(7))
    traj = sim.run(controller, GOAL, 6 * 0.002)
    # the same normals, drawn in the documented order: 4 for the measurement, then 2 for the torque, per step
    normals = np.random.default_rng(7).standard_normal(6 * 6 + 4).tolist()
    meas_std, torque_std = np.array(imperfections.measurement_noise), np.array(imperfections.torque_noise)
    u_last = np.zeros(2)
    for k in range(6):
        z = np.array(normals[6 * k: 6 * k + 4])
        expected_seen = traj.x[max(0, k - 2)] + z * meas_std
        np.testing.assert_array_equal(controller.seen[k], expected_seen)
        np.testing.assert_array_equal(traj.extras["x_measured"][k], expected_seen)
        lagged = u_last + 0.9 * (commands[k] - u_last)
        noisy = lagged + np.array(normals[6 * k + 4: 6 * k + 6]) * torque_std
        expected_u = np.array([min(max(noisy[0], -6.0), 6.0), 0.0])
        np.testing.assert_array_equal(traj.u[k], expected_u)
        u_last = expected_u
    assert traj.u[2, 0] == -6.0                      # the lag does not save a too-large command from the limit
    assert np.all(traj.u[:, 1] == 0.0)               # noise and lag never reach the passive joint
    # the plant integrates exactly the applied torque
    np.testing.assert_array_equal(traj.x[1], pendubot_plant.rk4_step_scalar(tuple(GOAL), tuple(traj.u[0]), 0.002))


def test_ideal_robot_reports_the_true_state_and_needs_no_rng(pendubot_plant):
    robot = SimulatedRobot(pendubot_plant, (6.0, 0.0), x0=(0.1, 0.2, 0.3, 0.4))
    np.testing.assert_array_equal(robot.measurement(), [0.1, 0.2, 0.3, 0.4])
    seen = robot.step((2.0, 1.0), "policy")
    np.testing.assert_array_equal(seen, robot.x)
    assert robot.applied == (2.0, 0.0) and robot.k == 1
    with pytest.raises(ValueError, match="Generator"):
        SimulatedRobot(pendubot_plant, (6.0, 0.0), imperfections=Imperfections(torque_noise=(0.1, 0.0)))


def test_noisy_runs_are_seeded(pendubot_plant):
    imperfections = Imperfections(measurement_noise=(0.01, 0.01, 0.1, 0.1), delay=0.005, motor_responsiveness=0.9,
                                  torque_noise=(0.2, 0.0))
    runs = [Simulator(pendubot_plant, (6.0, 0.0), imperfections=imperfections,
                      rng=np.random.default_rng(seed)).run(Greedy(), GOAL, 0.05) for seed in (4, 4, 5)]
    np.testing.assert_array_equal(runs[0].x, runs[1].x)
    assert not np.array_equal(runs[0].x, runs[2].x)


# ---------------------------------------------------------------- robot profiles


def test_shipped_profiles(pendubot_config, acrobot_config):
    nominal = load_robot_profile("nominal")
    assert nominal.plant_parameters(pendubot_config) == pendubot_config.plant
    assert nominal.imperfections(pendubot_config).is_ideal
    proxy = load_robot_profile("hardware_proxy")
    plant = proxy.plant_parameters(pendubot_config)
    assert plant.name == "model_1.0" and plant.cf == (0.16, 0.12) and plant.Ir > 0
    assert proxy.imperfections(pendubot_config) == Imperfections((0.0, 0.0, 0.05, 0.05), 0.005, 0.9, (0.02, 0.0))
    assert proxy.imperfections(acrobot_config).torque_noise == (0.0, 0.02)   # on the actuated elbow
    assert proxy.imperfections(pendubot_config).delay_steps(0.002) == 2
    # perturbed: every parameter within +-10 % of model_1.0, drawn from the seed; NAME:SEED picks another robot
    base = proxy.plant_parameters(pendubot_config)
    draws = [load_robot_profile(spec).plant_parameters(pendubot_config) for spec in ("perturbed", "perturbed:0",
                                                                                    "perturbed:1")]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    for params in draws:
        for key in ("m", "l", "r", "I", "Ir", "b", "cf"):
            ours, nominal_value = np.atleast_1d(getattr(params, key)), np.atleast_1d(getattr(base, key))
            assert np.all(np.abs(ours / nominal_value - 1.0) <= 0.1) and np.all(ours != nominal_value), key
    assert load_robot_profile("perturbed:1").label == "perturbed:1"
    assert load_robot_profile("perturbed").label == load_robot_profile("perturbed:0").label == "perturbed:0"
    assert load_robot_profile("hardware_proxy").label == "hardware_proxy"
    # the label names the run's robot and noise: loading it back gives the same profile (hardware_proxy:3 draws
    # other noise than hardware_proxy)
    for spec in ("nominal", "hardware_proxy", "hardware_proxy:3", "perturbed", "perturbed:2"):
        profile = load_robot_profile(spec)
        assert load_robot_profile(profile.label) == profile, spec


def test_from_profile_seeds_the_noise(pendubot_config):
    runs = []
    for seed in (3, 3, 4):
        robot = SimulatedRobot.from_profile("hardware_proxy", pendubot_config, seed, x0=GOAL)
        runs.append([robot.step((0.5, 0.0), "policy") for _ in range(20)])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])
    # the documented generator: default_rng([profile seed, run seed]); the first 4 normals are step 0's noise
    robot = SimulatedRobot.from_profile("hardware_proxy", pendubot_config, 3, x0=GOAL)
    z = np.random.default_rng([0, 3]).standard_normal(4)
    np.testing.assert_array_equal(robot.measurement(), GOAL + z * np.array([0.0, 0.0, 0.05, 0.05]))


@pytest.mark.parametrize("field, value, problem", [
    ("delay", -0.001, "must be in"),
    ("motor_responsiveness", 0.0, "must be in (0, 1]"),
    ("motor_responsiveness", 1.5, "must be in (0, 1]"),
    ("measurement_noise", [0.0, 0.1], "list of 4"),
    ("measurement_noise[2]", "x", "finite number"),
    ("torque_noise.actuated", -0.1, "must be in"),
    ("torque_noise.elbow", 0.1, "unknown field"),
    ("plant_model", "model_9", "not 'robot' nor a model"),
    ("perturbation", 0.9, "must be in"),
    ("seed", -1, "integer >= 0"),
    ("lag", 0.9, "unknown field"),
])
def test_bad_profile_values_name_the_file_and_field(tmp_path, repo, field, value, problem):
    data = yaml.safe_load((repo / "config" / "robot_profiles.yaml").read_text())
    profile = data["profiles"]["hardware_proxy"]
    key, _, index = field.partition("[")
    if index:
        profile[key][int(index[:-1])] = value
    elif "." in key:
        outer, inner = key.split(".")
        profile[outer][inner] = value
    else:
        profile[key] = value
    path = tmp_path / "robot_profiles.yaml"
    path.write_text(yaml.safe_dump(data))
    (tmp_path / "plant_models.yaml").write_text((repo / "config" / "plant_models.yaml").read_text())
    with pytest.raises(ConfigError) as info:
        load_robot_profile("hardware_proxy", path)
    assert str(path) in str(info.value) and f"field 'profiles.hardware_proxy.{field}'" in str(info.value)
    assert problem in str(info.value)


def test_profile_files_and_unknown_names(tmp_path, repo):
    with pytest.raises(ConfigError, match=r"field 'profiles.hardware_proxi': unknown robot profile"):
        load_robot_profile("hardware_proxi")
    (tmp_path / "plant_models.yaml").write_text((repo / "config" / "plant_models.yaml").read_text())
    own = tmp_path / "bench.yaml"
    own.write_text("plant_model: model_1.0\ndelay: 0.004\n")
    profile = load_robot_profile(own)
    assert profile.name == "bench" and profile.delay == 0.004 and profile.plant_model == "model_1.0"
    with pytest.raises(ConfigError, match="no such robot profile file"):
        load_robot_profile(tmp_path / "missing.yaml")


@pytest.mark.parametrize("models", ["", "- model_1.0\n", "models: [model_1.0]\n"])
def test_a_profiles_broken_plant_models_file_names_it(tmp_path, models):
    """The plant-models file beside a profile file, empty or a list, is a ConfigError naming it, not an
    AttributeError from inside the profile's validation."""
    (tmp_path / "plant_models.yaml").write_text(models)
    own = tmp_path / "bench.yaml"
    own.write_text("plant_model: model_1.0\ndelay: 0.004\n")
    with pytest.raises(ConfigError, match=r"plant_models\.yaml: field 'models': missing"):
        load_robot_profile(own)


def test_a_perturbed_profile_scales_each_parameter_by_its_documented_draw(pendubot_config):
    """perturbation p: each parameter of model_1.0, index by index in the order m, l, r, I, Ir, b, cf, times
    1 + U(-p, p) from np.random.default_rng(seed)."""
    profile = load_robot_profile("perturbed:4")
    base = load_robot_profile("hardware_proxy").plant_parameters(pendubot_config)
    params = profile.plant_parameters(pendubot_config)
    rng = np.random.default_rng(4)
    for key in ("m", "l", "r", "I", "Ir", "b", "cf"):
        for ours, nominal in zip(np.atleast_1d(getattr(params, key)), np.atleast_1d(getattr(base, key))):
            assert ours == nominal * (1.0 + rng.uniform(-profile.perturbation, profile.perturbation)), key


def test_a_perturbed_robot_is_scored_on_the_robot_configs_line(pendubot_config):
    """The perturbed robot's links are not the config's, but the score line is the protocol's: 0.9 (l1 + l2) of the
    robot config, in joint space the same for every profile."""
    robot = SimulatedRobot.from_profile("perturbed:4", pendubot_config, 0, x0=GOAL)
    assert robot.plant.params.l != pendubot_config.plant.l
    assert robot.score_plant.params == pendubot_config.plant
    # a state above the config's line and below the perturbed links' one (or the other way round) scores as the config's
    config_plant = DoublePendulum(pendubot_config.plant)
    q1 = np.linspace(1.5, 3.5, 4001)
    states = np.stack([q1, np.full_like(q1, 0.8), np.zeros_like(q1), np.zeros_like(q1)], -1)
    differ = ((config_plant.end_effector_height(states) > config_plant.height_threshold)
              != (robot.plant.end_effector_height(states) > robot.plant.height_threshold))
    state = states[np.flatnonzero(differ)[0]]
    above_config_line = float(config_plant.end_effector_height(state) > config_plant.height_threshold)
    scored = SimulatedRobot.from_profile("perturbed:4", pendubot_config, 0, x0=state)
    scored.step((0.0, 0.0))
    assert scored.finish().score == above_config_line
