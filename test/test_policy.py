"""Policy files: our .npz format, RealAIGym's pickled .np, and refusal of anything unsafe or broken."""

import io
import json
import os
import pickle

import numpy as np
import pytest

from mcpilco_core.control import build_controller
from mcpilco_core.evaluation import ControllerSpec, evaluate_seeds
from mcpilco_core.policy import (
    PolicyError,
    SumOfGaussiansPolicy,
    export_realaigym,
    features,
    import_realaigym,
    load_policy,
    save_policy,
)


def random_policy(robot="pendubot", nb=20, seed=0):
    rng = np.random.default_rng(seed)
    return SumOfGaussiansPolicy(centers=rng.uniform(-1, 1, (nb, 6)), log_lengthscales=rng.normal(0, 0.3, 6),
                                weights=rng.uniform(-3, 3, nb), u_max=3.0, robot=robot)


def test_policy_formula():
    policy = random_policy()
    x = np.array([0.3, -1.2, 2.0, -0.5])
    phi = features(x)
    np.testing.assert_allclose(phi, [2.0, -0.5, np.cos(0.3), np.cos(-1.2), np.sin(0.3), np.sin(-1.2)])
    act = np.exp(-np.sum(((policy.centers - phi) / np.exp(policy.log_lengthscales)) ** 2, axis=1))
    assert policy(x) == pytest.approx(3.0 * np.tanh(act @ policy.weights / 3.0))
    batch = np.stack([x, x + 0.1])
    assert policy(batch).shape == (2,) and abs(policy(batch)).max() <= 3.0


def test_own_format_round_trip(tmp_path):
    policy = random_policy()
    path = save_policy(policy, tmp_path / "p.npz", run_id="run-1", config_hash="abc")
    loaded = load_policy(path, robot="pendubot", torque_limit=6.0)
    np.testing.assert_array_equal(loaded.centers, policy.centers)
    assert loaded.version() == policy.version() and loaded.metadata["run_id"] == "run-1"
    x = np.random.default_rng(1).normal(size=(5, 4))
    np.testing.assert_array_equal(loaded(x), policy(x))


def test_realaigym_round_trip(tmp_path):
    policy = random_policy()
    path = export_realaigym(policy, tmp_path / "p.np")
    with open(path, "rb") as handle:
        raw = pickle.load(handle)  # trusted: we just wrote it
    assert set(raw) == {"log_lengthscales", "centers", "linear_weights"}
    loaded = load_policy(path, robot="pendubot")
    np.testing.assert_array_equal(loaded.weights, policy.weights)
    assert loaded(np.zeros(4)) == pytest.approx(policy(np.zeros(4)))


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.np"
    with open(path, "wb") as handle:
        pickle.dump({"centers": _Exploit(marker), "log_lengthscales": np.zeros(6),
                     "linear_weights": np.zeros(3)}, handle)
    with pytest.raises(PolicyError, match="refused to load"):
        load_policy(path, robot="pendubot")
    with pytest.raises(PolicyError, match="refused"):
        import_realaigym(path, "pendubot")
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"garbage", b"PK\x03\x04broken zip"])
def test_corrupt_files_are_refused(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(PolicyError, match=str(path.name)):
        load_policy(path)


def test_truncated_policy_is_refused(tmp_path):
    path = save_policy(random_policy(), tmp_path / "p.npz")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(PolicyError):
        load_policy(path)


def test_wrong_robot_shapes_and_values_are_refused(tmp_path):
    path = save_policy(random_policy(robot="acrobot"), tmp_path / "a.npz")
    with pytest.raises(PolicyError, match="trained for the acrobot"):
        load_policy(path, robot="pendubot")
    bad = random_policy()
    bad.weights[3] = np.nan
    with pytest.raises(PolicyError, match="NaN"):
        load_policy(save_policy(bad, tmp_path / "nan.npz"))
    big = random_policy()
    big.u_max = 8.0
    with pytest.raises(PolicyError, match="exceeds the torque limit"):
        load_policy(save_policy(big, tmp_path / "big.npz"), torque_limit=6.0)
    wrong = SumOfGaussiansPolicy(centers=np.zeros((4, 5)), log_lengthscales=np.zeros(5), weights=np.zeros(4),
                                 u_max=3.0, robot="pendubot")
    with pytest.raises(PolicyError, match="shape"):
        load_policy(save_policy(wrong, tmp_path / "shape.npz"))


def test_policy_in_the_supervisor_and_evaluator(tmp_path, pendubot_config):
    path = save_policy(random_policy(), tmp_path / "p.npz")
    controller = build_controller(pendubot_config, load_policy(path, robot="pendubot"))
    u = controller.step(np.zeros(4), 0.0)
    assert controller.mode == "policy" and u[1] == 0.0 and abs(u[0]) <= 3.0
    results = evaluate_seeds(ControllerSpec(pendubot_config.source, str(path)), [0], duration=5.0)
    assert results[0].passive_max_torque == 0.0
    assert results[0].mode_fractions.get("policy", 0.0) > 0.5


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_shipped_policies_load_and_never_torque_the_passive_joint(robot):
    """policies/<robot>.npz (what the launch files run by default) loads for its robot and, through the
    protocol's first disturbance, never commands the passive joint."""
    from mcpilco_core.evaluation import config_path_for
    from mcpilco_core.paths import shipped_policy

    path = shipped_policy(robot)
    assert path is not None and path.is_file()
    policy = load_policy(path, robot=robot, torque_limit=6.0)
    assert policy.robot == robot and np.isfinite(policy.weights).all()
    (result,) = evaluate_seeds(ControllerSpec(config_path_for(robot), str(path)), [0], duration=6.0)
    assert result.passive_max_torque == 0.0 and result.passive_max_applied_torque == 0.0


# --------------------------------------------------------------------------------------------------
# Every failure while reading a policy is a PolicyError naming the file (issue 13, item 1)


def write_npz(path, metadata=None, **arrays):
    """An .npz in our format's layout with the given metadata (any JSON value, or a raw array) and arrays."""
    policy = random_policy()
    base = {"centers": policy.centers, "log_lengthscales": policy.log_lengthscales, "weights": policy.weights}
    meta = {"format": "mcpilco_policy", "format_version": 1, "robot": "pendubot", "u_max": 3.0,
            "control_period": 0.02, "feature_order": ["dq1", "dq2", "cos_q1", "cos_q2", "sin_q1", "sin_q2"]}
    if isinstance(metadata, dict):
        meta.update(metadata)
    elif metadata is not None:
        meta = metadata
    meta_array = meta if isinstance(meta, np.ndarray) else np.array(json.dumps(meta))
    np.savez(path, **{**base, **arrays, "metadata": meta_array})
    return path


MALFORMED_NPZ = {
    "metadata_list": ([1, 2, 3], {}, "JSON object"),
    "metadata_string": ("just a string", {}, "JSON object"),
    "metadata_number_array": (np.arange(3.0), {}, "metadata"),
    "format_version_text": ({"format_version": "one"}, {}, "format_version"),
    "format_version_float": ({"format_version": 1.5}, {}, "format_version"),
    "feature_order_number": ({"feature_order": 5}, {}, "feature_order"),
    "feature_order_wrong": ({"feature_order": ["q1", "q2"]}, {}, "feature_order"),
    "u_max_text": ({"u_max": "three"}, {}, "u_max"),
    "u_max_list": ({"u_max": [3.0]}, {}, "u_max"),
    "u_max_true": ({"u_max": True}, {}, "u_max"),
    "u_max_numeric_text": ({"u_max": "3"}, {}, "u_max"),
    "control_period_true": ({"control_period": True}, {}, "control_period"),
    "robot_number": ({"robot": 7}, {}, "robot"),
    "no_robot": ({"robot": None}, {}, "robot"),
    "weights_strings": (None, {"weights": np.array(["a", "b"])}, "numeric"),
    "centers_1d": (None, {"centers": np.zeros(20)}, "shape"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_NPZ))
def test_malformed_npz_is_a_policy_error_naming_the_file(tmp_path, case):
    metadata, arrays, reason = MALFORMED_NPZ[case]
    path = write_npz(tmp_path / f"{case}.npz", metadata, **arrays)
    with pytest.raises(PolicyError) as info:
        load_policy(path, robot="pendubot")
    assert str(path) in str(info.value) and reason in str(info.value)


@pytest.mark.parametrize("robot", ["cartpole", ""])
def test_a_policy_for_an_unknown_robot_is_refused_even_without_a_robot_to_check(tmp_path, robot):
    """``mcpilco export`` loads a file without a robot to check it against: the file's own robot must be known."""
    path = write_npz(tmp_path / "other.npz", {"robot": robot})
    with pytest.raises(PolicyError, match="unknown robot"):
        load_policy(path)


@pytest.mark.parametrize("content", ["strings", "dicts", "list"])
def test_np_pickles_of_objects_are_a_policy_error(tmp_path, content):
    objects = {"strings": np.array(["x", "y"], dtype=object), "dicts": np.array([{"a": 1}, {"b": 2}], dtype=object),
               "list": ["centers", "weights"]}
    path = tmp_path / f"{content}.np"
    with open(path, "wb") as handle:
        pickle.dump({"centers": objects[content], "log_lengthscales": np.zeros(6), "linear_weights": np.ones(2)},
                    handle)
    with pytest.raises(PolicyError, match=str(path)):
        load_policy(path, robot="pendubot")


def test_cli_evaluate_and_export_report_a_bad_policy_and_exit_2(tmp_path, capsys):
    from mcpilco_ros.cli import main

    bad = write_npz(tmp_path / "bad.npz", [1, 2])
    assert main(["evaluate", "--robot", "pendubot", "--controller", str(bad), "--seeds", "0"]) == 2
    assert str(bad) in capsys.readouterr().err
    assert main(["export", str(bad), "--realaigym", str(tmp_path / "out.np")]) == 2
    assert str(bad) in capsys.readouterr().err and not (tmp_path / "out.np").exists()


def test_cli_export_to_a_missing_folder_or_a_folder_exits_2(tmp_path, repo, capsys):
    """`mcpilco export --realaigym` into a folder that does not exist, or onto a folder (--force), says so: no
    FileNotFoundError / IsADirectoryError traceback, no stray '<folder>.tmp' file."""
    from mcpilco_ros.cli import main

    policy = repo / "policies" / "pendubot.npz"
    assert main(["export", str(policy), "--realaigym", str(tmp_path / "nowhere" / "out.np")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "folder").mkdir()
    assert main(["export", str(policy), "--realaigym", str(tmp_path / "folder"), "--force"]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


# --------------------------------------------------------------------------------------------------
# Extreme but finite parameters and the policy's period (issue 13, item 3)


EXTREMES = {  # finite parameters whose torque is NaN/inf somewhere in the state box, or cannot be bounded there
    "lengthscale_-800": lambda p: p.log_lengthscales.__setitem__(0, -800.0),   # NaN torques (issue 13)
    "lengthscale_-710": lambda p: p.log_lengthscales.__setitem__(0, -710.0),   # 1/l * 100 rad/s overflows
    "weights_overflow": lambda p: p.weights.__setitem__(slice(0, 2), 1.7e308),
    "centers_overflow": lambda p: (p.centers.__setitem__((0, 0), 1.7e308), p.log_lengthscales.__setitem__(0, -1.0)),
}


@pytest.mark.parametrize("case", sorted(EXTREMES))
def test_parameters_giving_non_finite_torques_are_refused(tmp_path, case):
    raw = random_policy()
    EXTREMES[case](raw)
    policy = SumOfGaussiansPolicy(raw.centers, raw.log_lengthscales, raw.weights, 3.0, "pendubot")
    if case == "lengthscale_-800":
        assert np.isnan(policy(np.zeros(4)))          # what the check prevents
    path = save_policy(policy, tmp_path / "extreme.npz")
    with pytest.raises(PolicyError, match="not finite") as info:
        load_policy(path, robot="pendubot")
    assert str(path) in str(info.value)


def test_finite_extremes_that_stay_finite_are_accepted(tmp_path):
    policy = random_policy()
    policy.log_lengthscales[:] = 30.0          # huge lengthscales: a constant output, still finite
    policy = SumOfGaussiansPolicy(policy.centers, policy.log_lengthscales, policy.weights, 3.0, "pendubot")
    loaded = load_policy(save_policy(policy, tmp_path / "flat.npz"), robot="pendubot")
    assert np.isfinite(loaded(np.random.default_rng(0).uniform(-50, 50, (100, 4)))).all()


@pytest.mark.parametrize("period", [0.5, 1e9, 0.01])
def test_a_policy_period_other_than_the_controllers_is_refused(tmp_path, period):
    policy = random_policy()
    policy.control_period = period
    path = save_policy(policy, tmp_path / "period.npz")
    with pytest.raises(PolicyError, match="control_period|runs every") as info:
        load_policy(path, robot="pendubot", policy_period=0.02)
    assert str(path) in str(info.value)
    if period > 1.0:   # not a control period at all, whatever the controller
        with pytest.raises(PolicyError, match="control_period"):
            load_policy(path, robot="pendubot")


def test_evaluate_refuses_a_policy_for_another_period(tmp_path, pendubot_config):
    policy = random_policy()
    policy.control_period = 0.5
    path = save_policy(policy, tmp_path / "slow.npz")
    with pytest.raises(PolicyError, match="runs every 0.5 s"):
        ControllerSpec(pendubot_config.source, str(path)).build()


# --------------------------------------------------------------------------------------------------
# Bounded reading (issue 13, item 2)


def test_an_extra_array_in_the_archive_is_never_decompressed(tmp_path):
    import tracemalloc
    import zipfile

    path = save_policy(random_policy(), tmp_path / "extra.npz")
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(8 * 2**20, dtype=np.uint8))       # 8 MiB that compress to a few kB
        archive.writestr("junk.npy", buffer.getvalue())
    tracemalloc.start()
    try:
        loaded = load_policy(path, robot="pendubot")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loaded.num_basis == 20 and peak < 2 * 2**20


def test_oversize_members_headers_and_files_are_refused(tmp_path, monkeypatch):
    import mcpilco_core.policy as policy_module

    big = random_policy(nb=2000)
    path = save_policy(big, tmp_path / "big.npz")
    monkeypatch.setattr(policy_module, "MAX_MEMBER_BYTES", 10_000)
    with pytest.raises(PolicyError, match="'centers' declares .* bytes") as info:
        load_policy(path)
    assert str(path) in str(info.value)
    monkeypatch.setattr(policy_module, "MAX_FILE_BYTES", 1000)
    with pytest.raises(PolicyError, match="larger than a policy file may be"):
        load_policy(path)
    monkeypatch.undo()

    # a .npy header claiming 2**40 elements over a few bytes of data: refused before anything is allocated
    lying = tmp_path / "lying.npz"
    write_npz(lying)
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f8", "fortran_order": False, "shape": (2**40,)})
    with zipfile_replace(lying, "weights.npy", buffer.getvalue() + b"\0" * 16) as replaced:
        with pytest.raises(PolicyError, match="header says") as info:
            load_policy(replaced)
    assert str(replaced) in str(info.value)


class zipfile_replace:  # noqa: N801 - a context manager used like a function
    """Copy of an .npz with one member's bytes replaced."""

    def __init__(self, path, member, data):
        import zipfile

        self.out = path.with_name("replaced_" + path.name)
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(self.out, "w") as dst:
            for info in src.infolist():
                dst.writestr(info.filename, data if info.filename == member else src.read(info))

    def __enter__(self):
        return self.out

    def __exit__(self, *exc):
        self.out.unlink()


@pytest.mark.parametrize("robot, seconds, lqr_share, uptime",
                         [("pendubot", 6.0, 0.2, 2.0), ("acrobot", 10.0, 0.01, 1.0)])
def test_hardware_proxy_policy_runs_on_the_proxy_without_passive_torque(repo, robot, seconds, lqr_share, uptime):
    """policies/<robot>_hardware_proxy.npz (learned on the hardware-proxy robot) with its config, the LQR plus the
    balance dither: swings up and is up for a while, with exactly 0 N m on the passive joint. (The acrobot's is up
    mostly under its policy: the LQR holds it 8-11 % of the time, docs/learner.md.)"""
    path = repo / "policies" / f"{robot}_hardware_proxy.npz"
    policy = load_policy(path, robot=robot, torque_limit=6.0)
    assert policy.robot == robot and np.isfinite(policy.weights).all()
    spec = ControllerSpec(str(repo / "config" / f"{robot}_dither.yaml"), str(path))
    (result,) = evaluate_seeds(spec, [0], duration=seconds, profile="hardware_proxy")
    assert result.passive_max_torque == 0.0 and result.passive_max_applied_torque == 0.0
    assert result.mode_fractions.get("lqr", 0.0) > lqr_share and result.robot_profile == "hardware_proxy"
    assert result.uptime > uptime


def test_the_compensated_proxy_policy_says_so_and_bounds_the_passive_joint(repo):
    """policies/pendubot_hardware_proxy_compensated.npz runs with config/pendubot_friction_compensation.yaml:
    the passive joint gets only the compensation (<= 0.5 N m), and the evaluation says it was on."""
    path = repo / "policies" / "pendubot_hardware_proxy_compensated.npz"
    spec = ControllerSpec(str(repo / "config" / "pendubot_friction_compensation.yaml"), str(path))
    (result,) = evaluate_seeds(spec, [0], duration=6.0, profile="hardware_proxy")
    assert result.friction_compensation and result.to_dict()["friction_compensation"] is True
    assert 0.0 < result.passive_max_torque <= 0.5 and result.passive_max_applied_torque <= 0.5 + 1e-9


def test_the_proxy_acrobot_polished_on_two_design_robots_runs_with_the_tuned_balance(repo):
    """policies/acrobot_hardware_proxy_prior_catch.npz (docs/learner.md, "Two design robots judge the polish") runs
    with config/acrobot_dither_tuned.yaml on the proxy: it swings up, the LQR holds it for part of the time, exactly
    0 N m on the passive joint; its metadata says how it was polished (the identified prior, the catch model, two
    judge robots)."""
    path = repo / "policies" / "acrobot_hardware_proxy_prior_catch.npz"
    settings = load_policy(path, robot="acrobot", torque_limit=6.0).metadata["polished"]["settings"]
    assert settings["model"] == "prior" and settings["catch_level"] == 8.0
    assert len(settings["judge_profile"].split(",")) == 2
    spec = ControllerSpec(str(repo / "config" / "acrobot_dither_tuned.yaml"), str(path))
    (result,) = evaluate_seeds(spec, [0], duration=10.0, profile="hardware_proxy")
    assert result.passive_max_torque == 0.0 and result.passive_max_applied_torque == 0.0
    assert result.mode_fractions.get("lqr", 0.0) > 0.05 and result.uptime > 1.0


def test_the_reenter_config_is_the_tuned_balance_plus_the_reentry_rule(repo):
    """config/acrobot_dither_tuned_reenter.yaml differs from acrobot_dither_tuned.yaml in roa.reenter_below_line
    alone (the README's comparison of the two is a comparison of that rule), and shares its ROA estimate."""
    import dataclasses

    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control.roa import _cache_key

    tuned = load_robot_config(repo / "config" / "acrobot_dither_tuned.yaml")
    reenter = load_robot_config(repo / "config" / "acrobot_dither_tuned_reenter.yaml")
    assert reenter.roa.reenter_below_line and not tuned.roa.reenter_below_line
    assert dataclasses.replace(reenter, roa=tuned.roa, source=tuned.source) == tuned
    assert _cache_key(reenter) == _cache_key(tuned) and reenter.fingerprint() != tuned.fingerprint()


def test_the_select_reenter_config_is_the_selection_plus_the_reentry_rule_on_the_run_identified_plant(repo):
    """config/acrobot_dither_select_reenter.yaml is acrobot_dither_select.yaml with the re-entry rule and the
    candidates simulated on the plant identified from the proxy run's 22 s, nothing else (the README compares the
    two), shares its ROA estimate, and its bank loads eleven policies (twelve candidates with the loaded one)."""
    import dataclasses

    from mcpilco_core.config import load_plant_parameters, load_robot_config
    from mcpilco_core.control import load_bank
    from mcpilco_core.control.roa import _cache_key

    select = load_robot_config(repo / "config" / "acrobot_dither_select.yaml")
    reenter = load_robot_config(repo / "config" / "acrobot_dither_select_reenter.yaml")
    assert reenter.roa.reenter_below_line and not select.roa.reenter_below_line
    run_plant = load_plant_parameters(repo / "config" / "design_robots" / "plant_models.yaml",
                                      "identified_acrobot_proxy_run")
    assert reenter.selection.plant == run_plant != select.selection.plant
    assert dataclasses.replace(select.selection, plant_model=reenter.selection.plant_model,
                               plant=run_plant) == reenter.selection
    assert dataclasses.replace(reenter, roa=select.roa, selection=select.selection, source=select.source) == select
    assert _cache_key(reenter) == _cache_key(select)
    assert len(load_bank(reenter)) == 11


def test_the_select_noisy_config_is_select_reenter_plus_the_observer_the_delay_and_the_noisy_finals(repo):
    """config/acrobot_dither_select_noisy.yaml is acrobot_dither_select_reenter.yaml with the observer of
    acrobot_dither_observer.yaml, the design robot's delay and its identified noise in the noisy finals, and two
    worker processes for the ROS node's decisions, nothing else (the README compares the two)."""
    import dataclasses

    from mcpilco_core.config import load_robot_config
    from mcpilco_core.simulation import load_robot_profile

    reenter = load_robot_config(repo / "config" / "acrobot_dither_select_reenter.yaml")
    noisy = load_robot_config(repo / "config" / "acrobot_dither_select_noisy.yaml")
    observer = load_robot_config(repo / "config" / "acrobot_dither_observer.yaml").observer
    design = load_robot_profile(repo / "config" / "design_robots" / "acrobot_proxy_run_identified.yaml")
    assert noisy.observer == observer and observer.enabled and not reenter.observer.enabled
    settings = noisy.selection
    assert settings.delay == design.delay and (settings.noise_samples, settings.finalists) == (4, 3)
    assert np.allclose(settings.measurement_noise, design.measurement_noise, rtol=0.01)
    assert np.isclose(settings.torque_noise, design.torque_noise_actuated, rtol=0.01)
    assert settings.workers == 2 and reenter.selection.workers == 0
    assert dataclasses.replace(settings, delay=0.0, noise_samples=0, measurement_noise=(0.0,) * 4,
                               torque_noise=0.0, workers=0) == reenter.selection
    assert dataclasses.replace(noisy, selection=reenter.selection, observer=reenter.observer,
                               source=reenter.source) == reenter


def test_the_select_phases_config_is_select_noisy_plus_the_dither_phases_and_the_predicted_delay(repo):
    """config/acrobot_dither_select_phases.yaml is acrobot_dither_select_noisy.yaml with two dither phases and the
    start predicted over the delay in the selection, nothing else (the README compares the two), and shares its ROA
    estimate."""
    import dataclasses

    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control.roa import _cache_key

    noisy = load_robot_config(repo / "config" / "acrobot_dither_select_noisy.yaml")
    phases = load_robot_config(repo / "config" / "acrobot_dither_select_phases.yaml")
    assert (phases.selection.dither_phases, phases.selection.predict_delay) == (2, True)
    assert (noisy.selection.dither_phases, noisy.selection.predict_delay) == (1, False)
    assert dataclasses.replace(phases.selection, dither_phases=1, predict_delay=False) == noisy.selection
    assert dataclasses.replace(phases, selection=noisy.selection, source=noisy.source) == noisy
    assert _cache_key(phases) == _cache_key(noisy)


def test_the_mirror_image_does_from_the_mirrored_state_what_the_policy_does(repo):
    """pi'(x) = -pi(-x) exactly, twice mirrored is the policy again, and on the plant (friction and rotor inertia
    included: model_1.0) the motion under pi' from -x0 is the mirror image of the motion under pi from x0."""
    from mcpilco_core.config import load_plant_parameters
    from mcpilco_core.plant import DoublePendulum
    from mcpilco_core.policy import mirrored

    policy = load_policy(repo / "policies" / "acrobot.npz")
    image = mirrored(policy)
    x = np.random.default_rng(3).normal(0.0, 3.0, (200, 4))
    np.testing.assert_allclose(image(x), -policy(-x), rtol=1e-12, atol=1e-12)
    assert mirrored(image).version() == policy.version() and image.version() != policy.version()
    assert image.metadata["mirrored_from"] == policy.version()
    plant = DoublePendulum(load_plant_parameters(repo / "config" / "plant_models.yaml", "model_1.0"))
    ends = []
    for controller, start in ((policy, np.array([0.4, -0.3, 2.0, -1.0])), (image, np.array([-0.4, 0.3, -2.0, 1.0]))):
        x = start
        for _ in range(100):                                   # 2 s at the policy's 20 ms, RK4 at 2 ms
            u = np.array([0.0, float(controller(x))])
            for _ in range(10):
                x = plant.rk4_step(x, u, 0.002)
        ends.append(x)
    np.testing.assert_allclose(ends[1], -ends[0], atol=1e-9)


def test_mcpilco_mirror_writes_the_mirror_image_and_refuses_bad_paths(repo, tmp_path, capsys):
    from mcpilco_core.policy import mirrored
    from mcpilco_ros import cli

    source = repo / "policies" / "acrobot.npz"
    out = tmp_path / "image.npz"
    assert cli.main(["mirror", str(source), str(out)]) == 0
    assert load_policy(out).version() == mirrored(load_policy(source)).version()
    assert cli.main(["mirror", str(source), str(out)]) == 2 and "exists" in capsys.readouterr().err
    assert cli.main(["mirror", str(source), str(out), "--force"]) == 0
    assert cli.main(["mirror", str(source), str(tmp_path / "no" / "image.npz")]) == 2
    assert cli.main(["mirror", str(source), str(tmp_path / "image.txt")]) == 2
    assert cli.main(["mirror", str(tmp_path / "missing.npz"), str(tmp_path / "other.npz")]) == 2
    assert "error" in capsys.readouterr().err and not (tmp_path / "other.npz").exists()
    shipped = repo / "policies" / "acrobot_bank_mirrored"        # the shipped images are what the command writes
    assert len(sorted(shipped.glob("*.npz"))) == 2
    for path in sorted(shipped.glob("*.npz")):
        original = repo / "policies" / "acrobot_bank" / path.name.replace("_mirrored", "")
        assert load_policy(path).version() == mirrored(load_policy(original)).version()
