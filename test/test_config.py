"""Bad configuration gives an error that names the file and the field."""

import re

import pytest
import yaml

from mcpilco_core.config import ConfigError, load_robot_config, unwrap_ros_parameters


def write_config(tmp_path, repo, mutate=None, models_mutate=None, text=None):
    data = yaml.safe_load((repo / "config" / "pendubot.yaml").read_text())
    params = data["/**"]["ros__parameters"]
    models = yaml.safe_load((repo / "config" / "plant_models.yaml").read_text())
    if mutate:
        mutate(params)
    if models_mutate:
        models_mutate(models)
    (tmp_path / "plant_models.yaml").write_text(yaml.safe_dump(models))
    path = tmp_path / "robot.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data))
    return path


def test_shipped_configs_load(repo):
    for robot, joint in (("pendubot", 0), ("acrobot", 1)):
        config = load_robot_config(repo / "config" / f"{robot}.yaml")
        assert config.robot == robot and config.actuated_joint == joint
        assert config.torque_limits[1 - joint] == 0.0 and config.torque_limits[joint] == 6.0
        assert config.plant.name == "model_1.1"


@pytest.mark.parametrize("mutate,field", [
    (lambda p: p.pop("robot"), "robot"),
    (lambda p: p.update(robot="triplebot"), "robot"),
    (lambda p: p.update(torque_limit="six"), "torque_limit"),
    (lambda p: p.update(torque_limit=-1.0), "torque_limit"),
    (lambda p: p.update(u_max=9.0), "u_max"),
    (lambda p: p.update(plant_model="model_9"), "models.model_9"),
    (lambda p: p["lqr"].update(Q_diag=[1.0, 2.0]), "lqr.Q_diag"),
    (lambda p: p["damping"].update(exit_speed=30.0), "damping.exit_speed"),
    (lambda p: p["damping"].update(speed=3.0), "damping.speed"),
    (lambda p: p["roa"].update(samples=0), "roa.samples"),
    (lambda p: p.update(policy_period=0.001), "policy_period"),
    (lambda p: p.update(policy_period=0.005), "policy_period"),      # not a whole number of 2 ms control periods
])
def test_bad_values_name_file_and_field(tmp_path, repo, mutate, field):
    path = write_config(tmp_path, repo, mutate)
    with pytest.raises(ConfigError) as info:
        load_robot_config(path)
    assert info.value.field == field
    assert str(path.parent) in str(info.value) and field in str(info.value)


def test_negative_mass_names_plant_file(tmp_path, repo):
    def negative(models):
        models["models"]["model_1.1"]["m"][1] = -0.6

    path = write_config(tmp_path, repo, models_mutate=negative)
    with pytest.raises(ConfigError, match=r"plant_models.yaml: field 'models.model_1.1.m\[1\]': must be positive"):
        load_robot_config(path)


def test_inline_plant_parameters(tmp_path, repo):
    def inline(params):
        params["plant"] = {"m": [1.0, 1.0], "l": [0.5, 0.5], "r": [0.5, 0.5], "I": [0.25, 0.25]}

    config = load_robot_config(write_config(tmp_path, repo, inline))
    assert config.plant.m == (1.0, 1.0) and config.plant.g == 9.81


def test_malformed_and_missing_files(tmp_path, repo):
    with pytest.raises(ConfigError, match="cannot read"):
        load_robot_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_robot_config(write_config(tmp_path, repo, text="robot: [unclosed\n"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_robot_config(write_config(tmp_path, repo, text="- just\n- a list\n"))


def test_node_sections_merge_over_wildcard(tmp_path):
    data = {"/**": {"ros__parameters": {"robot": "pendubot", "damping": {"gain": 1.0, "enabled": True}}},
            "controller_node": {"ros__parameters": {"damping": {"gain": 2.0}}}}
    merged = unwrap_ros_parameters(data, "x.yaml", "controller_node")
    assert merged["damping"] == {"gain": 2.0, "enabled": True}
    assert unwrap_ros_parameters(data, "x.yaml")["damping"]["gain"] == 1.0


@pytest.mark.parametrize("where", ["/**", "<root>", "controller_node"])
def test_a_value_outside_ros_parameters_is_refused(tmp_path, repo, where):
    """u_max indented beside ros__parameters (or at the top level) is a file rcl refuses; the CLI must not load it
    with u_max silently left at its value from elsewhere."""
    data = yaml.safe_load((repo / "config" / "pendubot.yaml").read_text())
    data["/**"]["ros__parameters"]["plant_models_file"] = str(repo / "config" / "plant_models.yaml")
    (data if where == "<root>" else data[where])["u_max"] = 1.0
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(data))
    name = "u_max" if where == "<root>" else f"{where}.u_max"
    with pytest.raises(ConfigError, match=f"field '{re.escape(name)}': a value outside ros__parameters"):
        load_robot_config(path)
    nested = {"/**": {"ros__parameters": {"robot": "pendubot"}}, "ns": {"node": {"ros__parameters": {"u_max": 1.0}}}}
    assert unwrap_ros_parameters(nested, "x.yaml") == {"robot": "pendubot"}     # a namespace: valid ROS


def test_fingerprint_changes_with_behaviour(repo, tmp_path):
    base = load_robot_config(repo / "config" / "pendubot.yaml")
    changed = load_robot_config(write_config(tmp_path, repo, lambda p: p.update(torque_limit=5.0, u_max=5.0)))
    assert base.fingerprint() != changed.fingerprint()


@pytest.mark.parametrize("key", ["umax", "policy_perod"])
def test_unknown_top_level_key_is_an_error_naming_it(tmp_path, repo, key):
    path = write_config(tmp_path, repo, lambda p: p.update({key: 1.0}))
    with pytest.raises(ConfigError) as info:
        load_robot_config(path)
    assert info.value.field == key and "unknown key" in str(info.value) and str(path) in str(info.value)


def test_ros_own_parameters_are_allowed_in_a_robot_file(tmp_path, repo):
    assert load_robot_config(write_config(tmp_path, repo, lambda p: p.update(use_sim_time=True))).robot == "pendubot"


def test_inertia_below_m_r_squared_is_refused(tmp_path, repo):
    def small(models):
        models["models"]["model_1.1"]["I"][1] = 0.01   # m r^2 = 0.0409 kg m^2: no such body exists

    path = write_config(tmp_path, repo, models_mutate=small)
    with pytest.raises(ConfigError, match=r"plant_models.yaml: field 'models.model_1.1.I\[1\]': must be >= m\*r\^2"):
        load_robot_config(path)

    def inline(params):
        params["plant"] = {"m": [1.0, 1.0], "l": [0.5, 0.5], "r": [0.5, 0.5], "I": [0.2, 0.25]}

    with pytest.raises(ConfigError, match=r"field 'plant.I\[0\]': must be >= m\*r\^2 = 0.25"):
        load_robot_config(write_config(tmp_path, repo, inline))


def _nested_update(params: dict, dotted: str, value) -> None:
    *parents, key = dotted.split(".")
    for part in parents:
        params = params.setdefault(part, {})
    params[key] = value


def _numeric_settings():
    from mcpilco_core.config import robot_settings

    return [s for s in robot_settings() if s.setting.kind in (int, float) and not s.name.startswith("plant.")]


@pytest.mark.parametrize("entry", _numeric_settings(), ids=lambda s: s.name)
def test_every_range_of_the_metadata_is_enforced_by_the_loader(tmp_path, repo, entry):
    """The range on the dataclass field (the one the ROS descriptors carry) is what load_robot_config checks."""
    info = entry.setting
    assert info.high is not None and info.low is not None, "every numeric robot parameter has a range"
    too_high = info.high + 1 if info.kind is int else info.high * 2.0
    too_low = info.low - 1 if info.kind is int else (info.low if info.low_open else info.low - abs(info.low) - 1.0)
    for bad in (too_high, too_low):
        path = write_config(tmp_path, repo, lambda p, bad=bad: _nested_update(p, entry.name, bad))
        with pytest.raises(ConfigError) as error:
            load_robot_config(path)
        assert error.value.field == entry.name and f"got {bad!r}" in str(error.value)


def test_config_error_survives_pickling():
    """A worker process's ConfigError reaches the parent whole (evaluate_seeds with jobs > 1)."""
    import pickle

    error = pickle.loads(pickle.dumps(ConfigError("a.yaml", "lqr.Q", "must be positive")))
    assert isinstance(error, ConfigError)
    assert (error.source, error.field, error.problem) == ("a.yaml", "lqr.Q", "must be positive")
    assert str(error) == "a.yaml: field 'lqr.Q': must be positive"
