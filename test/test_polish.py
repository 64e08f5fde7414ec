"""``mcpilco polish``: the chosen policy optimised further on the run's newest model -- fixed learning rate, no
dropout, more particles, from the run's next start distribution -- with no robot time."""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from test_selection import tiny_run

from mcpilco_core.config import ConfigError
from mcpilco_core.learning import learner
from mcpilco_core.learning import polish as polish_module
from mcpilco_core.learning.cost import trajectory_cost
from mcpilco_core.learning.learner import initial_distribution, load_train_config
from mcpilco_core.learning.model import particle_noise, rollout
from mcpilco_core.learning.polish import PolishSettings, load_source, polish
from mcpilco_core.learning.protocol import protocol_judge
from mcpilco_core.learning.torch_policy import TorchPolicy
from mcpilco_core.policy import load_policy
from mcpilco_ros import cli

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("polish"), polish={"steps": 40, "lr": 0.01, "particles": 32,
                                                                            "snapshot_every": 0})


def model_cost(source, policy_file: Path) -> float:
    """The particle cost of a policy file on the source's model: 200 particles from the run's next start
    distribution, the same starts and noise for every policy."""
    config = source.config
    generator = torch.Generator().manual_seed(11)
    x0 = initial_distribution(config, source.next_trial, source.pool).sampler("cpu", config.torch_dtype)(200, generator)
    noise = particle_noise(config.horizon_steps, 200, generator, config.torch_dtype, "cpu")
    policy = TorchPolicy.from_numpy(load_policy(policy_file), config.torch_dtype)
    with torch.no_grad():
        states = rollout(source.model, policy, x0, config.horizon_steps, None, noise=noise, mode="reference")
    return float(trajectory_cost(states, config.cost))


def scripted_judge(monkeypatch, scores: list[float]) -> list[np.ndarray]:
    """Replace the polish's judge by one that answers ``scores`` in turn; returns the list of the weights it was
    shown, in order (each round's start is judged first)."""
    answers, judged = iter(scores), []

    def fake_judge(config, model, seeds, seconds, processes=1, profile=""):
        def judge(policy):
            judged.append(policy.weights.detach().clone().numpy())
            return next(answers)
        return judge

    monkeypatch.setattr(polish_module, "protocol_judge", fake_judge)
    return judged


def test_the_polish_section_loads_and_bad_values_name_the_field(tmp_path):
    base = yaml.safe_load((REPO / "config" / "train_tiny.yaml").read_text())
    base["robot_config"] = str(REPO / "config" / "pendubot.yaml")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(base))
    assert load_train_config(path).polish == PolishSettings()           # defaults: 1500 steps, lr 0.001, 400
    for bad, field in (({"steps": 0}, "polish.steps"), ({"lr": -1.0}, "polish.lr"),
                       ({"particles": 0}, "polish.particles"), ({"dropout": 0.1}, "polish"),
                       ({"height_weight": -1.0}, "polish.height_weight"),
                       ({"height_scale": 0.0}, "polish.height_scale"), ({"horizon": -1.0}, "polish.horizon"),
                       ({"rounds": 0}, "polish.rounds"), ({"round_gain": -1.0}, "polish.round_gain"),
                       ({"policy_period": -0.01}, "polish.policy_period"), ({"pool": "robot"}, "polish.pool"),
                       ({"retries": -1}, "polish.retries"), ({"robot_config": 3}, "polish.robot_config"),
                       ({"add_basis": -1}, "polish.add_basis"), ({"judge_seeds": -2}, "polish.judge_seeds"),
                       ({"confirm_seeds": -1}, "polish.confirm_seeds"), ({"first_round": 0}, "polish.first_round"),
                       ({"judge_processes": -1}, "polish.judge_processes"),
                       ({"velocity_lengthscale": -6.0}, "polish.velocity_lengthscale"),
                       ({"judge_profile": 3}, "polish.judge_profile"),
                       ({"catch_level": -1.0}, "polish.catch_level"),
                       ({"catch_sharpness": 0.0}, "polish.catch_sharpness"), ({"model": "exact"}, "polish.model")):
        path.write_text(yaml.safe_dump({**base, "polish": bad}))
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_train_config(path)
    with pytest.raises(ValueError, match="learning rate"):
        PolishSettings(lr=float("nan"))
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="velocity_lengthscale"):
            PolishSettings(velocity_lengthscale=bad)
        with pytest.raises(ValueError, match="catch_level"):
            PolishSettings(catch_level=bad)
    with pytest.raises(ValueError, match="model"):
        PolishSettings(model="exact")
    every = {"steps": 7, "lr": 0.002, "particles": 9, "seed": 4, "snapshot_every": 5, "height_weight": 2.0,
             "height_scale": 0.03, "candidates": 2, "horizon": 2.5, "u_max": 5.0, "rounds": 3, "round_gain": 0.01,
             "policy_period": 0.01, "pool": "policy", "retries": 1, "robot_config": "config/acrobot_catch.yaml",
             "add_basis": 20, "judge_seeds": 8, "confirm_seeds": 16, "first_round": 9,
             "judge_processes": 2, "velocity_lengthscale": 6.0, "judge_profile": "hardware_proxy",
             "catch_level": 8.0, "catch_sharpness": 3.0, "model": "prior"}
    assert set(every) == {f.name for f in fields(PolishSettings)}       # every key read, none silently ignored
    path.write_text(yaml.safe_dump({**base, "polish": every}))
    assert load_train_config(path).polish == PolishSettings(**every)


def test_polish_lowers_the_model_cost_without_dropout_or_the_robot(run, tmp_path, monkeypatch):
    def no_robot(*args, **kwargs):
        raise AssertionError("polish ran the robot")

    dropouts: list[float] = []
    set_dropout = TorchPolicy.set_dropout

    def record(self, probability, generator):
        dropouts.append(probability)
        set_dropout(self, probability, generator)

    monkeypatch.setattr(learner, "run_on_robot", no_robot)
    monkeypatch.setattr(TorchPolicy, "set_dropout", record)
    source = load_source(run)
    assert source.policy_file == run / "policy.npz" and source.next_trial == 4 and source.model_from == "trial 3"
    original = source.policy_file.read_bytes()
    result = polish(source, source.config.polish, tmp_path / "out", progress=False)
    assert result.optimization.steps == 40 and not any(dropouts)          # every basis function on, every step
    assert source.policy_file.read_bytes() == original                    # the source is never overwritten
    assert model_cost(source, result.policy_file) < model_cost(source, source.policy_file)
    report = json.loads((tmp_path / "out" / "polish.json").read_text())
    assert report["robot_time_s"] == 0.0 and report["steps"] == 40 and len(report["cost"]) == 40
    assert report["settings"] == {"steps": 40, "lr": 0.01, "particles": 32, "seed": 0, "snapshot_every": 0,
                                  "height_weight": 0.0, "height_scale": 0.02, "candidates": 1, "horizon": 0.0,
                                  "u_max": 0.0, "rounds": 1, "round_gain": 0.005, "policy_period": 0.0,
                                  "pool": "run", "retries": 0, "robot_config": "",
                                  "add_basis": 0, "judge_seeds": 0, "confirm_seeds": 0, "first_round": 1,
                                  "judge_processes": 0, "velocity_lengthscale": 0.0, "judge_profile": "",
                                  "catch_level": 0.0, "catch_sharpness": 4.0, "model": "gp"}
    assert report["snapshots"] == [] and report["kept_step"] == 40 and report["judge"] is None
    assert report["source_policy"] == str(run / "policy.npz")
    meta = load_policy(result.policy_file).metadata["polished"]
    assert meta["from"] == str(run / "policy.npz") and meta["robot_time_s"] == 0.0 and meta["steps"] == 40
    assert (tmp_path / "out" / "polish_curve.png").stat().st_size > 5_000
    # the same settings give the same policy; another seed another one
    again = polish(load_source(run), source.config.polish, tmp_path / "again", progress=False)
    first, second = load_policy(result.policy_file), load_policy(again.policy_file)
    np.testing.assert_array_equal(first.weights, second.weights)
    other = polish(load_source(run), PolishSettings(steps=40, lr=0.01, particles=32, seed=1, snapshot_every=0),
                   tmp_path / "other", progress=False)
    assert not np.array_equal(load_policy(other.policy_file).weights, first.weights)


@pytest.mark.parametrize("best", ["start", "middle", "end"])
def test_the_judge_keeps_the_best_snapshot_and_gives_back_the_start_when_nothing_beats_it(run, tmp_path,
                                                                                          monkeypatch, best, caplog):
    judged: list[np.ndarray] = []
    built: list[tuple] = []
    scores = {"start": [0.5, 0.2, 0.3, 0.4], "middle": [0.1, 0.2, 0.6, 0.3], "end": [0.1, 0.2, 0.3, 0.4]}[best]

    def fake_judge(config, model, seeds, seconds, processes=1, profile=""):
        built.append((tuple(seeds), seconds, processes))

        def judge(policy):
            judged.append(policy.weights.detach().clone().numpy())
            return scores[len(judged) - 1]
        return judge

    monkeypatch.setattr(polish_module, "protocol_judge", fake_judge)
    source = load_source(run)
    processes = 2 if best == "middle" else 0                     # 0: the training's optimizer.judge_processes
    settings = PolishSettings(steps=30, lr=0.01, particles=16, snapshot_every=10, judge_processes=processes)
    with caplog.at_level(logging.INFO):
        result = polish(source, settings, tmp_path / "out", progress=False)
    training = source.config.optimizer
    progress = [r.getMessage() for r in caplog.records if "judged" in r.getMessage()]   # a line per judged snapshot
    assert [line.split(",")[0] for line in progress] == [f"polish: step {k} of at most 30" for k in (10, 20, 30)]
    assert f"judged {scores[1]:.3f}" in progress[0]
    assert built == [(tuple(training.snapshot_seeds), training.snapshot_seconds,      # the training's judge seeds
                      processes or training.judge_processes)]
    assert len(judged) == 4                                      # the start and steps 10, 20, 30
    kept = {"start": 0, "middle": 20, "end": 30}[best]
    report = json.loads((tmp_path / "out" / "polish.json").read_text())
    assert report["kept_step"] == kept and [s for s, _ in report["snapshots"]] == [0, 10, 20, 30]
    weights = load_policy(result.policy_file).weights
    np.testing.assert_allclose(weights, judged[kept // 10], rtol=0, atol=1e-6)
    if best == "start":                                           # nothing beat it: the policy it was given
        np.testing.assert_allclose(weights, load_policy(source.policy_file).weights, rtol=0, atol=1e-6)
    assert load_policy(result.policy_file).metadata["polished"]["steps"] == kept


def test_the_default_judge_is_the_protocol_on_the_learners_own_robot(run, tmp_path, monkeypatch):
    def no_robot(*args, **kwargs):
        raise AssertionError("polish ran the robot")

    monkeypatch.setattr(learner, "run_on_robot", no_robot)
    source = load_source(run)
    settings = PolishSettings(steps=4, lr=0.01, particles=8, snapshot_every=2)
    polish(source, settings, tmp_path / "out", progress=False)
    report = json.loads((tmp_path / "out" / "polish.json").read_text())
    assert [s for s, _ in report["snapshots"]] == [0, 2, 4] and report["robot_time_s"] == 0.0
    assert all(0.0 <= score <= 1.0 for _, score in report["snapshots"])
    assert report["judge"]["seeds"] == list(source.config.optimizer.snapshot_seeds)
    assert report["judge"]["processes"] == 1 and report["judge_time_s"] > 0
    start = report["snapshots"][0][1]                                 # the start's score is the protocol's on the
    judge = protocol_judge(source.config, source.model, source.config.optimizer.snapshot_seeds,   # learner's robot
                           source.config.optimizer.snapshot_seconds)
    assert judge(TorchPolicy.from_numpy(load_policy(source.policy_file), torch.float64)) == pytest.approx(start)


def test_cli_polishes_the_selected_policy_by_default_and_refuses_bad_input(run, tmp_path, capsys):
    chosen = tmp_path / "run"
    shutil.copytree(run, chosen)
    selected = chosen / "trials" / "trial_002" / "policy.npz"
    (chosen / "selection.json").write_text(json.dumps({"selected_policy": str(selected)}))
    assert cli.main(["polish", str(chosen), "--steps", "5", "--particles", "8"]) == 0
    report = json.loads((chosen / "polish" / "polish.json").read_text())
    assert report["source_policy"] == str(selected) and report["steps"] == 5
    assert report["settings"]["lr"] == 0.01                     # not overridden: the run's polish section
    assert "no robot time" in capsys.readouterr().out
    explicit = chosen / "trials" / "trial_001" / "policy.npz"
    assert cli.main(["polish", str(chosen), "--policy", str(explicit), "--steps", "2", "--out",
                     str(tmp_path / "explicit")]) == 0
    assert json.loads((tmp_path / "explicit" / "polish.json").read_text())["source_policy"] == str(explicit)
    assert cli.main(["polish", str(chosen), "--steps", "0"]) == 2
    assert "steps >= 1" in capsys.readouterr().err
    assert cli.main(["polish", str(chosen), "--policy", str(tmp_path / "missing.npz")]) == 2
    assert "no policy file" in capsys.readouterr().err
    before = (chosen / "polish" / "policy.npz").read_bytes()         # polishing the default output into itself:
    assert cli.main(["polish", str(chosen), "--policy", str(chosen / "polish" / "policy.npz")]) == 2   # refused
    assert (chosen / "polish" / "policy.npz").read_bytes() == before
    assert "would be overwritten" in capsys.readouterr().err
    assert cli.main(["polish", str(tmp_path / "nothing")]) == 2
    acrobot = REPO / "policies" / "acrobot.npz"                 # a policy for the other robot: a clear error
    assert cli.main(["polish", str(chosen), "--policy", str(acrobot), "--steps", "2"]) == 2
    assert "acrobot" in capsys.readouterr().err


def recorded_costs(monkeypatch) -> list:
    """The cost settings each optimisation of the polish was given, in order (the optimiser runs as it would)."""
    used: list = []
    optimize = polish_module.optimize_policy

    def record(*args, **kwargs):
        used.append(args[5])
        return optimize(*args, **kwargs)

    monkeypatch.setattr(polish_module, "optimize_policy", record)
    return used


def test_the_height_term_joins_the_polish_cost_on_the_controllers_own_links(run, tmp_path, monkeypatch):
    """polish.height_weight / --height-weight: the training cost plus the below-the-line term; 0 leaves it as it is."""
    source = load_source(run)
    assert polish_module.polish_cost(source.config, PolishSettings()) == source.config.cost
    cost = polish_module.polish_cost(source.config, PolishSettings(height_weight=2.0, height_scale=0.05))
    plant = source.config.robot.plant
    assert cost.height_weight == 2.0 and cost.height_scale == 0.05
    assert cost.link_lengths == (plant.l[0], plant.l[1]) and cost.height_line == pytest.approx(0.9 * sum(plant.l))
    assert cost.lengthscales == source.config.cost.lengthscales      # the rest is the training cost
    used = recorded_costs(monkeypatch)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--height-weight", "2",
                     "--out", str(tmp_path / "h")]) == 0
    assert used[-1].height_weight == 2.0 and used[-1].height_line == pytest.approx(0.9 * sum(plant.l))
    report = json.loads((tmp_path / "h" / "polish.json").read_text())
    assert report["settings"]["height_weight"] == 2.0
    assert load_policy(tmp_path / "h" / "policy.npz").metadata["polished"]["settings"]["height_weight"] == 2.0
    assert cli.main(["polish", str(run), "--height-weight", "-1"]) == 2


def test_the_velocity_term_of_the_polish_cost_is_the_trainings_unless_named(run, tmp_path, monkeypatch):
    """polish.velocity_lengthscale / --velocity-lengthscale (rad/s): the cost's velocity term for both joints, the
    rest of the cost the training's; 0 leaves it as it is; negative: a clear error, nothing written."""
    source = load_source(run)
    assert polish_module.polish_cost(source.config, PolishSettings(velocity_lengthscale=0.0)) == source.config.cost
    cost = polish_module.polish_cost(source.config, PolishSettings(velocity_lengthscale=6.0, height_weight=1.0))
    assert cost.velocity_lengthscales == (6.0, 6.0) and cost.height_weight == 1.0
    assert cost.lengthscales == source.config.cost.lengthscales
    states = torch.tensor([[math.pi, 0.0, 4.0, 0.0]], dtype=torch.float64)      # upright, the shoulder at 4 rad/s
    steep, plain = (trajectory_cost(states[None], polish_module.polish_cost(source.config, PolishSettings(
        velocity_lengthscale=lv))) for lv in (6.0, 24.0))
    assert float(steep) > float(plain)                                  # passing the top fast costs more
    used = recorded_costs(monkeypatch)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--velocity-lengthscale", "6",
                     "--out", str(tmp_path / "v")]) == 0
    assert used[-1].velocity_lengthscales == (6.0, 6.0)
    assert json.loads((tmp_path / "v" / "polish.json").read_text())["settings"]["velocity_lengthscale"] == 6.0
    assert cli.main(["polish", str(run), "--velocity-lengthscale", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_the_judge_runs_on_the_named_profile_instead_of_the_learners_own_robot(run, tmp_path, monkeypatch, capsys):
    """polish.judge_profile / --judge-profile: the snapshot judge, the confirming seeds and the "judge" pool run on
    that robot profile (e.g. a design robot), with the polish's robot config as the controller; '' = the learner's
    own robot (protocol.on_model); a profile that does not load: a clear error, nothing written."""
    from mcpilco_core.learning import protocol as protocol_module

    source = load_source(run)
    profiles: list = []
    scores = protocol_module.protocol_scores

    def record(config, policy, robot, seeds, seconds, profile, processes=1):
        profiles.append((robot, profile))
        return scores(config, policy, robot, seeds, seconds, profile, processes)

    monkeypatch.setattr(protocol_module, "protocol_scores", record)
    pools: list = []
    post = learner.post_disturbance_states

    def record_pool(controller, robot, seeds, profile=None):
        pools.append((robot, profile))
        return post(controller, robot, seeds, profile=profile)

    monkeypatch.setattr(learner, "post_disturbance_states", record_pool)
    design = str(REPO / "config" / "design_robots" / "pendubot_exploration_identified.yaml")
    settings = PolishSettings(steps=4, lr=0.01, particles=8, snapshot_every=2, pool="judge", judge_profile=design,
                              confirm_seeds=2)
    result = polish(source, settings, tmp_path / "p", progress=False)
    polish_module.confirm_round(source, settings, 1, SimpleNamespace(kept_step=2, policy_file=result.policy_file))
    assert len(profiles) == 3 + 2 and all(p == design and r == source.config.robot for r, p in profiles)
    assert pools == [(source.config.robot, design)]
    assert json.loads((tmp_path / "p" / "polish.json").read_text())["settings"]["judge_profile"] == design
    profiles.clear()
    own_robot, own_profile = protocol_module.on_model(source.config, source.model)
    polish(source, replace(settings, judge_profile=""), tmp_path / "q", progress=False)
    assert len(profiles) == 3 and all(p == own_profile and r == own_robot for r, p in profiles)  # as before
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--judge-profile", design,
                     "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c" / "polish.json").read_text())["settings"]["judge_profile"] == design
    assert cli.main(["polish", str(run), "--judge-profile", "no_such_robot", "--out", str(tmp_path / "bad")]) == 2
    assert "judge_profile" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_several_judge_profiles_are_judged_on_each_and_averaged(run, tmp_path, monkeypatch, capsys):
    """--judge-profile A B (polish.judge_profile "A,B"): the judge's score is the mean of its score on each robot,
    on the same seeds, and the "judge" pool holds each robot's states in the order named; each name is checked as
    one is (a true robot among them is refused), an empty name between commas too."""
    from mcpilco_core.learning import protocol as protocol_module

    source = load_source(run)
    design = str(REPO / "config" / "design_robots" / "pendubot_exploration_identified.yaml")
    both = f"nominal,{design}"
    assert protocol_module.judge_profiles(both) == ["nominal", design]
    assert protocol_module.judge_profiles("") == [""]
    policy = TorchPolicy.from_numpy(load_policy(REPO / "policies" / "pendubot.npz"), source.config.torch_dtype)
    one = [protocol_module.protocol_judge(source.config, source.model, [3, 4], 5.0, profile=name)(policy)
           for name in ("nominal", design)]
    assert one[0] != one[1]          # the two robots differ, so the mean is not either's score
    mean = protocol_module.protocol_judge(source.config, source.model, [3, 4], 5.0, profile=both)(policy)
    assert mean == pytest.approx((one[0] + one[1]) / 2, abs=1e-12)
    pools: list = []
    post = learner.post_disturbance_states

    def record_pool(controller, robot, seeds, profile=None):
        states, rest = post(controller, robot, seeds, profile=profile)
        pools.append((profile, len(states)))
        return states, rest

    monkeypatch.setattr(learner, "post_disturbance_states", record_pool)
    states = polish_module.policy_pool(source.config, load_policy(source.policy_file), source.model, both)
    assert [p for p, _ in pools] == ["nominal", design] and len(states) == sum(n for _, n in pools) > 0
    for bad, said in ((f"{design},hardware_proxy", "true robot"), (f"{design},,nominal", "empty name")):
        with pytest.raises(ValueError, match=said):
            polish_module.polish_config(source.config, PolishSettings(judge_profile=bad))
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--judge-profile", "nominal", design,
                     "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c" / "polish.json").read_text())["settings"]["judge_profile"] == both
    polish(source, PolishSettings(steps=2, lr=0.01, particles=8, snapshot_every=2, judge_profile=both),
           tmp_path / "p", progress=False)
    assert both in json.loads((tmp_path / "p" / "polish.json").read_text())["judge"]["robot"]
    assert cli.main(["polish", str(run), "--judge-profile", design, "hardware_proxy",
                     "--out", str(tmp_path / "bad")]) == 2
    assert "true robot" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_the_judge_may_not_run_on_a_true_robot(run, tmp_path, capsys):
    """The judge is an uncounted simulation, so it runs on the prior or on a design robot, never on the robot the
    policy is for: a built-in profile other than nominal (hardware_proxy, its ablations, another noise seed), a file
    with the same plant and imperfections as one, a perturbed robot, or the run's own robot profile is refused
    before anything is written; nominal and an identified design robot are accepted."""
    source = load_source(run)
    design = str(REPO / "config" / "design_robots" / "pendubot_exploration_identified.yaml")
    for allowed in ("nominal", design):
        assert polish_module.polish_config(source.config, PolishSettings(judge_profile=allowed)) is source.config
    profiles = yaml.safe_load((REPO / "config" / "robot_profiles.yaml").read_text())
    copy = tmp_path / "my_robot.yaml"
    copy.write_text(yaml.safe_dump({**profiles["profiles"]["hardware_proxy"], "description": "a copy",
                                    "seed": 12}))
    shutil.copy(REPO / "config" / "plant_models.yaml", tmp_path / "plant_models.yaml")
    for true_robot, said in (("hardware_proxy", "true robot"), ("hardware_proxy:4", "'hardware_proxy'"),
                             ("hardware_proxy_plant", "true robot"), ("hardware_proxy_sensors", "true robot"),
                             (str(copy), "'hardware_proxy'"), ("perturbed:3", "perturbed robot")):
        with pytest.raises(ValueError, match=said):
            polish_module.polish_config(source.config, PolishSettings(judge_profile=true_robot))
    own = replace(source.config, robot_profile=design)          # a run whose trials ran on that robot
    with pytest.raises(ValueError, match="true robot"):
        polish_module.polish_config(own, PolishSettings(judge_profile=design))
    assert cli.main(["polish", str(run), "--judge-profile", "hardware_proxy", "--out", str(tmp_path / "bad")]) == 2
    assert "true robot" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_the_catch_model_in_the_polish_cost_is_the_polish_controllers(run, tmp_path, monkeypatch):
    """polish.catch_level / --catch-level: the cost's catch model with V the polish's controller's LQR cost-to-go and
    V50 = level x its ROA level rho (--robot-config's controller when named), k = --catch-sharpness; 0 leaves the
    cost as it was; a controller whose LQR never takes over is refused."""
    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control import build_controller

    source = load_source(run)
    plain = polish_module.polish_cost(source.config, PolishSettings())
    assert plain.catch_v50 == 0.0 and plain == source.config.cost
    variant = REPO / "config" / "pendubot_dither.yaml"
    settings = PolishSettings(catch_level=8.0, catch_sharpness=3.0, robot_config=str(variant))
    config = polish_module.polish_config(source.config, settings)
    cost = polish_module.polish_cost(config, settings)
    supervisor = build_controller(load_robot_config(variant))
    assert cost.catch_v50 == pytest.approx(8.0 * supervisor.rho) and cost.catch_sharpness == 3.0
    np.testing.assert_allclose(np.array(cost.roa_metric), supervisor.design.S)
    assert cost.lengthscales == plain.lengthscales and cost.velocity_lengthscales == plain.velocity_lengthscales
    caught = torch.zeros(3, 1, 4, dtype=torch.float64)
    caught[:, 0, 0] = math.pi                              # at the top all along: caught, costs (almost) nothing
    assert float(trajectory_cost(caught, cost)) < 0.1 * float(trajectory_cost(caught + 0.3, cost))
    never = replace(config, robot=replace(config.robot, roa=replace(config.robot.roa, enter_fraction=0.0)))
    with pytest.raises(ValueError, match="enter_fraction"):
        polish_module.polish_cost(never, settings)
    used: list = []
    optimize = polish_module.optimize_policy

    def record(policy, model, sampler, particles, steps, cost_settings, *args, **kwargs):
        used.append(cost_settings)
        return optimize(policy, model, sampler, particles, steps, cost_settings, *args, **kwargs)

    monkeypatch.setattr(polish_module, "optimize_policy", record)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--catch-level", "6",
                     "--catch-sharpness", "2", "--out", str(tmp_path / "c")]) == 0
    assert used[-1].catch_v50 == pytest.approx(6.0 * build_controller(source.config.robot).rho)
    report = json.loads((tmp_path / "c" / "polish.json").read_text())["settings"]
    assert report["catch_level"] == 6.0 and report["catch_sharpness"] == 2.0


def test_the_polish_can_roll_out_on_the_physics_prior_alone(run, tmp_path, monkeypatch):
    """polish.model: prior / --model prior: the particles follow the model's physics prior alone -- the GP's mean and
    latent variance 0, its noise at gp.noise_floor -- with the prior the fit identified; the run's model itself is
    unchanged, and the default rolls out on it."""
    from mcpilco_core.learning.model import rollout

    source = load_source(run)
    model = source.model
    prior_only = polish_module.physics_prior_model(model)
    assert prior_only.posterior is not model.posterior and prior_only.prior_constants == model.prior_constants
    x = torch.tensor([[0.3, -0.2, 1.0, -0.5], [2.9, 0.4, -2.0, 3.0]], dtype=model.posterior.packed.dtype)
    u = torch.tensor([0.7, -1.5], dtype=x.dtype)
    inputs = torch.cat([x[:, 2:], torch.cos(x[:, :2]), torch.sin(x[:, :2]), u[:, None]], -1)
    mean, var = prior_only.posterior.predict(inputs)
    assert torch.all(mean == 0) and torch.allclose(var, torch.full_like(var, model.settings.noise_floor))
    gp_mean, _ = model.posterior.predict(inputs, include_noise=False)
    assert float(gp_mean.abs().max()) > 0                  # the run's own model still has its GP
    policy = TorchPolicy.from_numpy(load_policy(source.policy_file), x.dtype)
    with torch.no_grad():
        states = rollout(prior_only, policy, x, 3, None, sample=False)
        reference = rollout(prior_only, policy, x, 3, None, sample=False, mode="reference")
    np.testing.assert_allclose(states.numpy(), reference.numpy(), rtol=1e-4, atol=1e-5)
    step = states[1].double().numpy()                      # one step = the prior's velocity change, nothing more
    u0 = policy.forward_features(inputs[:, :6]).detach().double().numpy()
    expected = model.prior_mean(x.double().numpy(), u0)
    np.testing.assert_allclose(step[:, 2:] - x.double().numpy()[:, 2:], expected, rtol=1e-4, atol=1e-5)
    models: list = []
    optimize = polish_module.optimize_policy

    def record(policy, model_used, *args, **kwargs):
        models.append(model_used)
        return optimize(policy, model_used, *args, **kwargs)

    monkeypatch.setattr(polish_module, "optimize_policy", record)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--model", "prior",
                     "--out", str(tmp_path / "p")]) == 0
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--out", str(tmp_path / "g")]) == 0
    assert float(models[0].posterior.signal.abs().max()) == 0.0 and float(models[1].posterior.signal.min()) > 0
    assert json.loads((tmp_path / "p" / "polish.json").read_text())["settings"]["model"] == "prior"



def test_the_polish_can_roll_out_on_the_prior_with_the_robots_state_rate_friction(run, tmp_path, capsys):
    """polish.model: robot / --model robot: the physics prior alone (as ``prior``) with the friction and rotor
    inertia identified at the state rate (gp.identify_robot) and the 20 ms fit's command delay; the run's model is
    unchanged; a model without the state-rate robot is refused naming gp.identify_robot."""
    from mcpilco_core.learning.identification import parameters_of, with_parameters
    from mcpilco_core.learning.identified_robot import IdentifiedRobot

    model = load_source(run).model
    with pytest.raises(ValueError, match="gp.identify_robot"):
        polish_module.polish_model(model, "robot")
    assert polish_module.polish_model(model, "gp") is model
    robot_plant = with_parameters(model.config.plant, np.array([0.001, 0.002, 0.16, 0.12, 6.3e-5]))
    model.robot = IdentifiedRobot(plant=robot_plant, delay_steps=2, dt=0.002, motor_responsiveness=0.9,
                                  measurement_noise=(0.0, 0.0, 0.05, 0.05), torque_noise=0.02, residual=(0.1, 0.1),
                                  windows=100)
    model.delay_fraction = 0.2
    before = (model.prior_constants, parameters_of(model.config.plant))
    try:
        on_robot = polish_module.polish_model(model, "robot")
        assert parameters_of(on_robot.config.plant) == pytest.approx([0.001, 0.002, 0.16, 0.12, 6.3e-5])
        assert on_robot.prior_constants.friction == ((0, 0.001, 0.16), (1, 0.002, 0.12))
        assert on_robot.delay_fraction == 0.2 and float(on_robot.posterior.signal.abs().max()) == 0.0
        assert model.prior_constants == before[0] and list(parameters_of(model.config.plant)) == list(before[1])
        assert on_robot.prior_constants._replace(friction=before[0].friction, a=before[0].a, m12=before[0].m12,
                                                 m22=before[0].m22) == before[0]     # only Ir and friction
    finally:
        model.robot = None
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--model", "robot",
                     "--out", str(tmp_path / "r")]) == 2              # this run identified no robot: a clear error
    assert "gp.identify_robot" in capsys.readouterr().err and not (tmp_path / "r" / "policy.npz").exists()

def test_the_horizon_of_the_polish_is_the_trainings_unless_named(run, tmp_path, monkeypatch, capsys):
    """polish.horizon / --horizon (s): the particles' rollout length; 0 keeps the training horizon. Shorter than one
    policy period, negative or not finite: a clear error, nothing written."""
    source = load_source(run)
    period = source.config.robot.policy_period
    used: list[int] = []
    optimize = polish_module.optimize_policy

    def record(*args, **kwargs):
        used.append(args[4])
        return optimize(*args, **kwargs)

    monkeypatch.setattr(polish_module, "optimize_policy", record)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--out", str(tmp_path / "a")]) == 0
    assert used[-1] == source.config.horizon_steps
    longer = source.config.horizon + 5 * period
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--horizon", str(longer),
                     "--out", str(tmp_path / "b")]) == 0
    assert used[-1] == source.config.horizon_steps + 5
    report = json.loads((tmp_path / "b" / "polish.json").read_text())
    assert report["horizon_s"] == pytest.approx(longer) and report["settings"]["horizon"] == pytest.approx(longer)
    assert f"horizon {longer:g} s" in capsys.readouterr().out
    assert cli.main(["polish", str(run), "--horizon", str(period / 2), "--out", str(tmp_path / "c")]) == 2
    assert "shorter than one policy period" in capsys.readouterr().err and not (tmp_path / "c").exists()
    assert cli.main(["polish", str(run), "--horizon", "nan", "--out", str(tmp_path / "d")]) == 2
    assert "horizon must be" in capsys.readouterr().err and len(used) == 2


def test_several_candidates_are_polished_and_the_best_judged_is_kept(run, tmp_path, monkeypatch, capsys):
    """polish.candidates / --candidates K: the selected policy and the next best of the ranking, each polished, the
    one whose kept snapshot the judge scores highest is the output."""
    chosen = tmp_path / "run"
    shutil.copytree(run, chosen)
    with pytest.raises(ValueError, match="mcpilco select"):                    # no selection yet
        polish_module.candidate_policies(chosen, 2)
    (chosen / "selection.json").write_text(json.dumps({"selected_trial": 2, "ranking": [3, 2, 1], "selected_policy":
                                                       str(chosen / "trials" / "trial_002" / "policy.npz")}))
    files = polish_module.candidate_policies(chosen, 2)
    assert files == [chosen / "trials" / "trial_002" / "policy.npz", chosen / "trials" / "trial_003" / "policy.npz"]
    assert len(polish_module.candidate_policies(chosen, 10)) == 3                # as many as were ranked
    scores = iter([0.1, 0.2, 0.15, 0.3, 0.5, 0.4])                               # candidate 1 wins at step 2

    def fake_judge(config, model, seeds, seconds, processes=1, profile=""):
        return lambda policy: next(scores)

    monkeypatch.setattr(polish_module, "protocol_judge", fake_judge)
    source = load_source(chosen)
    settings = PolishSettings(steps=4, lr=0.01, particles=8, snapshot_every=2, candidates=2)
    result = polish_module.polish_candidates(source, settings, files, tmp_path / "out", progress=False)
    out = tmp_path / "out"
    assert result.policy_file == out / "policy.npz"
    assert (out / "policy.npz").read_bytes() == (out / "candidate_1" / "policy.npz").read_bytes()
    report = json.loads((out / "polish.json").read_text())
    assert report["chosen_candidate"] == 1 and report["source_policy"] == str(files[1]) and report["kept_step"] == 2
    assert [(c["policy"], c["kept_step"], c["judge"]) for c in report["candidates"]] == [
        (str(files[0]), 2, 0.2), (str(files[1]), 2, 0.5)]
    assert load_policy(out / "policy.npz").metadata["polished"]["from"] == str(files[1])
    # bad combinations: named errors, nothing polished
    assert cli.main(["polish", str(chosen), "--candidates", "2"]) == 2            # the run's polish: no snapshots
    assert "snapshot_every" in capsys.readouterr().err
    assert cli.main(["polish", str(chosen), "--candidates", "2", "--policy", str(files[0])]) == 2
    assert cli.main(["polish", str(chosen), "--candidates", "0"]) == 2
    (chosen / "selection.json").write_text(json.dumps({"selected_trial": 7, "ranking": [7]}))
    with pytest.raises(ValueError, match="no policy file for trial 7"):
        polish_module.candidate_policies(chosen, 2)


def test_the_policy_bound_can_be_raised_for_the_polish_up_to_the_torque_limit(run, tmp_path, monkeypatch, capsys):
    """polish.u_max / --u-max (N m): the same weights under a higher tanh bound (the policy is unchanged where it
    was not saturated), the judge's robot config clipping at that bound as the controller does, and never above
    the torque limit; 0 keeps the policy's own bound."""
    source = load_source(run)
    own = load_policy(source.policy_file)
    assert own.u_max == 3.0 and source.config.robot.torque_limit == 6.0
    assert polish_module.polish_config(source.config, PolishSettings()) is source.config
    raised = polish_module.polish_config(source.config, PolishSettings(u_max=6.0))
    assert raised.robot.u_max == 6.0 and raised.robot.plant == source.config.robot.plant
    with pytest.raises(ValueError, match="exceeds the torque limit"):
        polish_module.polish_config(source.config, PolishSettings(u_max=6.5))
    with pytest.raises(ValueError, match="u_max must be"):
        PolishSettings(u_max=-1.0)
    started: list = []
    optimize = polish_module.optimize_policy

    def record(policy, *args, **kwargs):
        started.append((policy.u_max, policy.weights.detach().clone()))
        return optimize(policy, *args, **kwargs)

    monkeypatch.setattr(polish_module, "optimize_policy", record)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--u-max", "6",
                     "--out", str(tmp_path / "u6")]) == 0
    assert "policy bound raised to 6 N m" in capsys.readouterr().out
    assert started[-1][0] == 6.0
    np.testing.assert_allclose(started[-1][1].numpy(), own.weights, rtol=0, atol=1e-6)   # the weights as given
    polished = load_policy(tmp_path / "u6" / "policy.npz")
    assert polished.u_max == 6.0 and polished.metadata["polished"]["u_max_raised_from"] == 3.0
    assert json.loads((tmp_path / "u6" / "polish.json").read_text())["settings"]["u_max"] == 6.0
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--out", str(tmp_path / "own")]) == 0
    assert started[-1][0] == 3.0 and "u_max_raised_from" not in load_policy(tmp_path / "own" / "policy.npz").metadata[
        "polished"]
    assert cli.main(["polish", str(run), "--u-max", "9", "--out", str(tmp_path / "over")]) == 2
    assert "exceeds the torque limit 6.0 N m" in capsys.readouterr().err and not (tmp_path / "over").exists()


def test_rounds_go_on_from_each_kept_policy_while_the_judge_gains_enough(run, tmp_path, monkeypatch, capsys):
    """polish.rounds / --rounds N: round K + 1 starts from round K's output while a round's judge gains at least
    round_gain over its start; the first round that gains less is discarded and the rounds stop."""
    # snapshots per round (start, step 2, step 4): round 1 gains 0.3, round 2 0.1, round 3 only 0.004 < 0.005
    judged = scripted_judge(monkeypatch, [0.1, 0.4, 0.2, 0.4, 0.45, 0.5, 0.5, 0.504, 0.3])
    source = load_source(run)
    settings = PolishSettings(steps=4, lr=0.01, particles=8, snapshot_every=2, rounds=5, round_gain=0.005)
    result = polish_module.polish_rounds(source, settings, tmp_path / "out", progress=False)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("round_*")) == ["round_1", "round_2", "round_3"]   # stopped after 3
    assert result.policy_file == out / "policy.npz"
    assert (out / "policy.npz").read_bytes() == (out / "round_2" / "policy.npz").read_bytes()  # round 3 discarded
    for start, previous in ((3, "round_1"), (6, "round_2")):          # each round starts from the one before
        np.testing.assert_allclose(judged[start], load_policy(out / previous / "policy.npz").weights, atol=1e-6)
    report = json.loads((out / "polish.json").read_text())
    assert [(r["round"], r["kept_step"], r["kept"]) for r in report["rounds"]] == [(1, 2, True), (2, 4, True),
                                                                                    (3, 2, False)]
    assert report["rounds"][1]["policy"] == str(out / "round_1" / "policy.npz")
    assert report["policy"] == str(out / "policy.npz") and report["robot_time_s"] == 0.0
    # the command line: bad values and the combination with candidates are named errors, nothing written
    bad = ["--out", str(tmp_path / "bad")]
    assert cli.main(["polish", str(run), "--rounds", "0"] + bad) == 2
    assert "rounds >= 1" in capsys.readouterr().err
    assert cli.main(["polish", str(run), "--rounds", "2"] + bad) == 2            # the run's polish: no snapshots
    assert "snapshot_every >= 1 to judge several" in capsys.readouterr().err
    assert cli.main(["polish", str(run), "--round-gain", "-0.1"] + bad) == 2
    assert "round_gain" in capsys.readouterr().err
    chosen = tmp_path / "run"
    shutil.copytree(run, chosen)
    (chosen / "selection.json").write_text(json.dumps({"selected_trial": 2, "ranking": [3, 2], "selected_policy":
                                                       str(chosen / "trials" / "trial_002" / "policy.npz")}))
    config = yaml.safe_load((chosen / "train_config.yaml").read_text())
    config["polish"]["snapshot_every"] = 2
    (chosen / "train_config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["polish", str(chosen), "--rounds", "2", "--candidates", "2"] + bad) == 2
    assert "several rounds" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_one_round_that_gains_nothing_gives_back_the_policy_it_was_given(run, tmp_path, monkeypatch):
    scores = iter([0.5, 0.3, 0.2])

    monkeypatch.setattr(polish_module, "protocol_judge", lambda *a: (lambda policy: next(scores)))
    source = load_source(run)
    settings = PolishSettings(steps=4, lr=0.01, particles=8, snapshot_every=2, rounds=3)
    polish_module.polish_rounds(source, settings, tmp_path / "out", progress=False)
    np.testing.assert_allclose(load_policy(tmp_path / "out" / "policy.npz").weights,
                               load_policy(source.policy_file).weights, rtol=0, atol=1e-6)
    assert [r["kept"] for r in json.loads((tmp_path / "out" / "polish.json").read_text())["rounds"]] == [True]
    chosen = tmp_path / "run"                                   # the command line runs the rounds too
    shutil.copytree(run, chosen)
    config = yaml.safe_load((chosen / "train_config.yaml").read_text())
    config["polish"].update(snapshot_every=1, rounds=3)
    (chosen / "train_config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setattr(polish_module, "protocol_judge", lambda *a: (lambda policy: 0.5))
    assert cli.main(["polish", str(chosen), "--steps", "2", "--particles", "8"]) == 0
    assert [p.name for p in (chosen / "polish").glob("round_*")] == ["round_1"]
    polished = chosen / "polish"
    assert (polished / "policy.npz").read_bytes() == (polished / "round_1" / "policy.npz").read_bytes()


def test_a_policy_period_refits_the_model_on_the_same_trials_and_polishes_for_that_rate(run, tmp_path, monkeypatch,
                                                                                         capsys):
    """polish.policy_period / --policy-period S: the model refitted at S on the run's own recorded trials (cut at
    the new period, so twice the transitions at half the period, no robot time), the robot identified at the state
    rate kept, the horizon in steps of S, and the policy's weights as given, now held S; 0 or the run's own period
    changes nothing; a period that is not a whole number of control periods is a named error."""
    def no_robot(*args, **kwargs):
        raise AssertionError("the refit ran the robot")

    monkeypatch.setattr(learner, "run_on_robot", no_robot)
    source = load_source(run)
    own = source.config.robot.policy_period
    assert own == 0.02
    assert polish_module.at_policy_period(run, source, 0.0) is source
    assert polish_module.at_policy_period(run, source, own) is source
    faster = polish_module.at_policy_period(run, source, 0.01)
    assert faster.config.robot.policy_period == 0.01 and faster.model.period == 0.01
    assert faster.config.robot.control_period == source.config.robot.control_period
    assert faster.model.robot is source.model.robot and faster.pool is source.pool
    assert "refitted at 0.01 s" in faster.model_from and source.config.robot.policy_period == own  # source unchanged
    from mcpilco_core.learning.runs import run_transitions

    slow, fast = run_transitions(run, source.config), run_transitions(run, faster.config)
    assert 1.8 * len(slow) <= len(fast) <= 2.2 * len(slow)
    # the refitted model predicts the recorded 10 ms velocity changes; the run's 20 ms model would be twice off
    change = np.sqrt(np.mean((fast.x_next[:, 2:] - fast.x[:, 2:]) ** 2))
    assert np.sqrt(np.mean(faster.model.one_step_errors(fast)["learned"] ** 2)) < 0.1 * change
    assert np.sqrt(np.mean(source.model.one_step_errors(fast)["learned"] ** 2)) > 0.5 * change
    with pytest.raises(ValueError, match="whole number of control periods"):
        polish_module.at_policy_period(run, source, 0.005)
    with pytest.raises(ValueError, match="horizon"):
        polish_module.at_policy_period(run, source, 0.4)
    horizons: list[int] = []
    optimize = polish_module.optimize_policy

    def record(policy, model, sampler, particles, horizon_steps, *args, **kwargs):
        horizons.append((horizon_steps, model.period, policy.weights.detach().clone()))
        return optimize(policy, model, sampler, particles, horizon_steps, *args, **kwargs)

    monkeypatch.setattr(polish_module, "optimize_policy", record)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--policy-period", "0.01",
                     "--out", str(tmp_path / "fast")]) == 0
    assert "policy period 0.01 s" in capsys.readouterr().out
    steps, period, weights = horizons[-1]
    assert (steps, period) == (round(source.config.horizon / 0.01), 0.01)
    np.testing.assert_allclose(weights.numpy(), load_policy(source.policy_file).weights, rtol=0, atol=1e-6)
    polished = load_policy(tmp_path / "fast" / "policy.npz", policy_period=0.01)
    assert polished.control_period == 0.01 and polished.metadata["polished"]["policy_period_changed_from"] == 0.02
    assert json.loads((tmp_path / "fast" / "polish.json").read_text())["settings"]["policy_period"] == 0.01
    with pytest.raises(Exception, match="0.01"):
        load_policy(tmp_path / "fast" / "policy.npz", policy_period=0.02)       # the controller at 50 Hz refuses it
    assert cli.main(["polish", str(run), "--policy-period", "0.003", "--out", str(tmp_path / "bad")]) == 2
    assert "whole number of control periods" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_the_policys_own_post_disturbance_states_can_start_the_particles(run, tmp_path, monkeypatch, capsys):
    """polish.pool / --pool policy: the particles' post-disturbance starts are the states the policy being
    polished meets right after the protocol's disturbances on the learner's model (the pool seeds), not the run's
    pool; simulated, never the robot; each round from its own start policy."""
    def no_robot(*args, **kwargs):
        raise AssertionError("the pool ran the robot")

    monkeypatch.setattr(learner, "run_on_robot", no_robot)
    source = load_source(run)
    config = source.config
    policy = load_policy(source.policy_file)
    states = polish_module.policy_pool(config, policy)
    seeds = config.initial_state.disturbance_seeds
    assert states.shape == (15 * len(seeds), 4)                      # 15 disturbances per protocol seed
    from mcpilco_core.control import build_controller
    expected, _ = learner.post_disturbance_states(build_controller(config.robot, policy), config.model_robot, seeds)
    np.testing.assert_array_equal(states, expected)
    assert len(states) != len(source.pool)                           # the run's pool: every trial's and more
    pools: list[np.ndarray] = []
    distribution = learner.initial_distribution

    def record(config, trial, pool):
        pools.append(pool)
        return distribution(config, trial, pool)

    monkeypatch.setattr(learner, "initial_distribution", record)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--pool", "policy",
                     "--out", str(tmp_path / "own")]) == 0
    assert "starts from the policy's own post-disturbance states" in capsys.readouterr().out
    np.testing.assert_array_equal(pools[-1], states)
    report = json.loads((tmp_path / "own" / "polish.json").read_text())
    assert report["settings"]["pool"] == "policy" and report["pool_states"] == len(states)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--out", str(tmp_path / "run")]) == 0
    np.testing.assert_array_equal(pools[-1], source.pool)
    assert json.loads((tmp_path / "run" / "polish.json").read_text())["pool_states"] == len(source.pool)
    with pytest.raises(ValueError, match="pool must be one of run, policy, judge"):
        PolishSettings(pool="robot")
    # "judge": the same, on the robot the judge runs on (the learner's own identified robot), never the robot
    from mcpilco_core.learning.protocol import on_model

    robot, profile = on_model(config, source.model)
    judged, _ = learner.post_disturbance_states(build_controller(config.robot, policy), robot, seeds, profile=profile)
    np.testing.assert_array_equal(polish_module.policy_pool(config, policy, source.model), judged)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--pool", "judge",
                     "--out", str(tmp_path / "judge")]) == 0
    assert "post-disturbance states on the judge's robot" in capsys.readouterr().out
    np.testing.assert_array_equal(pools[-1], judged)


def test_a_round_that_gains_too_little_may_retry_with_the_next_seed_before_the_rounds_stop(run, tmp_path,
                                                                                          monkeypatch, capsys):
    """polish.retries / --retries R: a round that gains less than round_gain is discarded and the next round starts
    from the last kept policy with the next particle seed; R such rounds in a row, then the rounds stop."""
    # (start, step 2, step 4) per round: gain, too little, gain with seed 1, too little, too little -> stop (R = 1)
    judged = scripted_judge(monkeypatch, [0.1, 0.4, 0.2, 0.4, 0.402, 0.401, 0.4, 0.5, 0.45, 0.5, 0.5, 0.5,
                                          0.5, 0.501, 0.5])
    settings = PolishSettings(steps=4, lr=0.01, particles=8, snapshot_every=2, rounds=8, retries=1)
    out = tmp_path / "out"
    polish_module.polish_rounds(load_source(run), settings, out, progress=False)
    report = json.loads((out / "polish.json").read_text())
    assert [(r["round"], r["seed"], r["kept"]) for r in report["rounds"]] == [
        (1, 0, True), (2, 0, False), (3, 1, True), (4, 1, False), (5, 2, False)]
    assert (out / "policy.npz").read_bytes() == (out / "round_3" / "policy.npz").read_bytes()
    for start, previous in ((6, "round_1"), (9, "round_3"), (12, "round_3")):   # each from the last kept
        np.testing.assert_allclose(judged[start], load_policy(out / previous / "policy.npz").weights, atol=1e-6)
    assert json.loads((out / "round_3" / "polish.json").read_text())["settings"]["seed"] == 1
    # round 2 and round 3 start from the same policy with other seeds: other particles, another result
    assert not np.array_equal(load_policy(out / "round_2" / "policy.npz").weights,
                              load_policy(out / "round_3" / "policy.npz").weights)
    assert cli.main(["polish", str(run), "--rounds", "2", "--retries", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert "retries must be >= 0" in capsys.readouterr().err


def test_each_round_may_be_judged_on_new_seeds_with_its_start_judged_again(run, tmp_path, monkeypatch, capsys):
    """polish.judge_seeds / --judge-seeds N: round k's snapshots, its start included, are judged on N protocol seeds
    of their own (the first snapshot seed + N (k - 1) onwards), so a round's bar is not the previous round's
    maximum on the same seeds; 0 keeps the training's snapshot seeds in every round."""
    calls: list[tuple[int, ...]] = []
    scores = iter([0.1, 0.4, 0.2, 0.3, 0.35, 0.31, 0.3, 0.302, 0.3])   # per round: start, step 2, step 4

    def fake_judge(config, model, seeds, seconds, processes=1, profile=""):
        calls.append(tuple(seeds))
        return lambda policy: next(scores)

    monkeypatch.setattr(polish_module, "protocol_judge", fake_judge)
    source = load_source(run)
    first = source.config.optimizer.snapshot_seeds[0]
    settings = PolishSettings(steps=4, lr=0.01, particles=8, snapshot_every=2, rounds=5, judge_seeds=3)
    out = tmp_path / "out"
    polish_module.polish_rounds(source, settings, out, progress=False)
    assert calls == [tuple(range(first + 3 * k, first + 3 * k + 3)) for k in range(3)]
    report = json.loads((out / "polish.json").read_text())
    # round 2's start was 0.4 on round 1's seeds and is 0.3 on its own: its 0.35 is a gain; round 3's is not
    assert [(r["judge_start"], r["judge_kept"], r["kept"]) for r in report["rounds"]] == [
        (0.1, 0.4, True), (0.3, 0.35, True), (0.3, 0.302, False)]
    assert [r["judge_seeds"] for r in report["rounds"]] == [list(c) for c in calls]
    assert json.loads((out / "round_2" / "polish.json").read_text())["judge"]["seeds"] == list(calls[1])
    assert (out / "policy.npz").read_bytes() == (out / "round_2" / "policy.npz").read_bytes()
    # 0 (the default): the training's snapshot seeds, the same in every round
    calls.clear()
    scores = iter([0.1, 0.4, 0.2, 0.4, 0.401, 0.4])
    polish_module.polish_rounds(load_source(run), replace(settings, judge_seeds=0), tmp_path / "same",
                                progress=False)
    assert calls == [tuple(source.config.optimizer.snapshot_seeds)] * 2
    with pytest.raises(ValueError, match="rounds count from 1"):
        settings.judge_seeds_for(source.config.optimizer, 0)
    assert cli.main(["polish", str(run), "--rounds", "2", "--judge-seeds", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert "judge_seeds must be >= 0" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_a_round_may_be_kept_only_when_it_gains_on_seeds_it_was_not_picked_on(run, tmp_path, monkeypatch, capsys):
    """polish.confirm_seeds / --confirm-seeds N: round k's start and kept snapshot are judged again on N seeds of
    their own (CONFIRM_FIRST_SEED + N (k - 1) onwards), and the round counts as a gain only there: the best of the
    snapshots beats the start on the seeds it was picked on by noise alone. A first round that does not gain there
    gives the start back; a round that kept its start is not judged again."""
    from mcpilco_core.learning.optimizer import CONFIRM_FIRST_SEED

    calls: list[tuple[int, ...]] = []
    # per round: start, step 2, step 4 on the judge's seeds; then (when judged) start and kept on the confirming ones
    scores = iter([0.1, 0.4, 0.2, 0.3, 0.33,      # round 1: picked 0.4, confirmed 0.3 -> 0.33: kept
                   0.3, 0.5, 0.2, 0.31, 0.31,     # round 2: picked 0.5 (noise), confirmed 0.31 -> 0.31: discarded
                   0.3, 0.2, 0.2])                # round 3: kept its start: not judged again, discarded; stop
    seen: list[np.ndarray] = []

    processes: list[int] = []

    def fake_judge(config, model, seeds, seconds, judge_processes=1, profile=""):
        calls.append(tuple(seeds))
        processes.append(judge_processes)
        return lambda policy: (seen.append(policy.weights.detach().numpy().copy()), next(scores))[1]

    monkeypatch.setattr(polish_module, "protocol_judge", fake_judge)
    source = load_source(run)
    given = load_policy(source.policy_file).weights
    settings = PolishSettings(steps=4, lr=0.01, particles=8, snapshot_every=2, rounds=5, judge_seeds=3,
                              confirm_seeds=2, retries=1, judge_processes=3)
    out = tmp_path / "out"
    polish_module.polish_rounds(source, settings, out, progress=False)
    assert processes == [3] * 5                   # the confirming judge runs in the polish's processes too
    first = source.config.optimizer.snapshot_seeds[0]
    confirm = [tuple(range(CONFIRM_FIRST_SEED + 2 * k, CONFIRM_FIRST_SEED + 2 * k + 2)) for k in range(2)]
    assert calls == [tuple(range(first, first + 3)), confirm[0], tuple(range(first + 3, first + 6)), confirm[1],
                     tuple(range(first + 6, first + 9))]
    report = json.loads((out / "polish.json").read_text())
    assert [(r["judge_start"], r["judge_kept"], r["confirm_start"], r["confirm_kept"], r["kept"])
            for r in report["rounds"]] == [(0.1, 0.4, 0.3, 0.33, True), (0.3, 0.5, 0.31, 0.31, False),
                                           (0.3, 0.3, None, None, False)]
    assert [r["confirm_seeds"] for r in report["rounds"]] == [list(confirm[0]), list(confirm[1]),
                                                             [CONFIRM_FIRST_SEED + 4, CONFIRM_FIRST_SEED + 5]]
    assert (out / "policy.npz").read_bytes() == (out / "round_1" / "policy.npz").read_bytes()
    # the confirming judge saw the round's start (the policy given) and the round's kept policy
    np.testing.assert_array_equal(seen[3], given)
    np.testing.assert_array_equal(seen[4], load_policy(out / "round_1" / "policy.npz").weights)
    # no round gains on its confirming seeds: the policy given is given back
    scores = iter([0.1, 0.4, 0.2, 0.3, 0.29])
    polish_module.polish_rounds(load_source(run), replace(settings, rounds=1), tmp_path / "none", progress=False)
    assert (tmp_path / "none" / "policy.npz").read_bytes() == source.policy_file.read_bytes()
    report = json.loads((tmp_path / "none" / "polish.json").read_text())
    assert report["kept_step"] == 0 and report["rounds"][0]["kept"] is False
    with pytest.raises(ValueError, match="rounds count from 1"):
        settings.confirm_seeds_for(0)
    assert cli.main(["polish", str(run), "--rounds", "2", "--confirm-seeds", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert "confirm_seeds must be >= 0" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_a_continued_polish_numbers_its_rounds_on_and_judges_on_seeds_not_used_yet(run, tmp_path, monkeypatch,
                                                                                     capsys):
    """polish.first_round / --first-round K: the rounds are numbered from K (OUT/round_K), and round K's judge and
    confirming seeds are those round K of one long polish would use, so a polish continued from another's output
    does not judge again on the seeds the earlier rounds picked and confirmed on; a single polish is round K."""
    from mcpilco_core.learning.optimizer import CONFIRM_FIRST_SEED

    calls: list[tuple[int, ...]] = []

    def fake_judge(config, model, seeds, seconds, processes=1, profile=""):
        calls.append(tuple(seeds))
        return lambda policy: 0.5          # nothing gains: one round, then the stop

    monkeypatch.setattr(polish_module, "protocol_judge", fake_judge)
    settings = PolishSettings(steps=2, lr=0.01, particles=8, snapshot_every=2, rounds=2, judge_seeds=3,
                              confirm_seeds=2, first_round=4)
    polish_module.polish_rounds(load_source(run), settings, tmp_path / "on", progress=False)
    first = load_source(run).config.optimizer.snapshot_seeds[0]
    assert calls[0] == tuple(range(first + 9, first + 12))                         # round 4's judge seeds
    assert settings.confirm_seeds_for(4) == tuple(range(CONFIRM_FIRST_SEED + 6, CONFIRM_FIRST_SEED + 8))
    assert (tmp_path / "on" / "round_4" / "policy.npz").exists() and not (tmp_path / "on" / "round_1").exists()
    report = json.loads((tmp_path / "on" / "polish.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [4] and report["rounds"][0]["judge_seeds"] == list(calls[0])
    calls.clear()
    polish_module.polish(load_source(run), replace(settings, rounds=1), tmp_path / "single", progress=False)
    assert calls[0] == tuple(range(first + 9, first + 12))                          # a single polish is round 4 too
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--first-round", "2", "--out",
                     str(tmp_path / "cli")]) == 0
    assert json.loads((tmp_path / "cli" / "polish.json").read_text())["settings"]["first_round"] == 2
    assert cli.main(["polish", str(run), "--first-round", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "first_round must be >= 1" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def _robot_config_variant(tmp_path: Path, name: str, **changes) -> Path:
    """config/pendubot.yaml copied to tmp_path/name with ``changes`` to its parameters ("roa.enter_fraction": a
    nested key), its plant models and ROA estimate beside it (the estimate is keyed by the LQR's fingerprint)."""
    data = yaml.safe_load((REPO / "config" / "pendubot.yaml").read_text())
    params = data["/**"]["ros__parameters"]
    for key, value in changes.items():
        *path, last = key.split(".")
        section = params
        for part in path:
            section = section[part]
        section[last] = value
    target = tmp_path / name
    target.write_text(yaml.safe_dump(data))
    shutil.copyfile(REPO / "config" / "plant_models.yaml", tmp_path / "plant_models.yaml")
    shutil.copyfile(REPO / "config" / "pendubot.roa.json", target.with_suffix(".roa.json"))
    return target


def test_the_polish_can_judge_with_the_controller_the_policy_will_run_in(run, tmp_path, monkeypatch, capsys):
    """polish.robot_config / --robot-config: the judge's protocol and the policy pool run the named robot config's
    controller (its switching, LQR, catch) around the policy; refused for another robot or another policy period."""
    from mcpilco_core.config import load_robot_config

    source = load_source(run)
    variant = _robot_config_variant(tmp_path, "wide_band.yaml", **{"roa.enter_fraction": 5.0})
    config = polish_module.polish_config(source.config, PolishSettings(robot_config=str(variant)))
    assert config.robot == load_robot_config(variant) and config.robot.roa.enter_fraction == 5.0
    assert source.config.robot.roa.enter_fraction == 4.0 and config.model_robot.plant == source.config.model_robot.plant
    # a controller designed on another plant: the controller's plant changes, the learner's prior (the pool's) not
    other = _robot_config_variant(tmp_path, "other_plant.yaml", plant_model="model_1.0")
    designed = polish_module.polish_config(source.config, PolishSettings(robot_config=str(other)))
    assert designed.robot.plant == load_robot_config(other).plant != source.config.model_robot.plant
    assert designed.model_robot.plant == source.config.model_robot.plant
    raised = polish_module.polish_config(source.config, PolishSettings(robot_config=str(variant), u_max=6.0))
    assert raised.robot.roa.enter_fraction == 5.0 and raised.robot.u_max == 6.0
    with pytest.raises(ValueError, match="is for the acrobot, the run's robot is the pendubot"):
        polish_module.polish_config(source.config, PolishSettings(robot_config=str(REPO / "config" / "acrobot.yaml")))
    fast = _robot_config_variant(tmp_path, "fast.yaml", policy_period=0.01)
    with pytest.raises(ValueError, match="runs the policy every 0.01 s, the polish is for 0.02 s"):
        polish_module.polish_config(source.config, PolishSettings(robot_config=str(fast)))
    assert polish_module.polish_config(source.config, PolishSettings(robot_config=str(fast), policy_period=0.01))
    with pytest.raises(ValueError, match="missing.yaml"):
        polish_module.polish_config(source.config, PolishSettings(robot_config=str(tmp_path / "missing.yaml")))

    seen: dict[str, list] = {"judge": [], "pool": []}

    def fake_judge(config, model, seeds, seconds, processes=1, profile=""):
        seen["judge"].append(config.robot)
        return lambda policy: 0.5

    pool = polish_module.policy_pool

    def record_pool(config, policy, model=None, judge_profile=""):
        seen["pool"].append(config.robot)
        return pool(config, policy, model, judge_profile)

    monkeypatch.setattr(polish_module, "protocol_judge", fake_judge)
    monkeypatch.setattr(polish_module, "policy_pool", record_pool)
    settings = PolishSettings(steps=2, particles=8, snapshot_every=1, pool="policy", robot_config=str(variant))
    polish(source, settings, tmp_path / "wide", progress=False)
    assert [robot.roa.enter_fraction for robot in seen["judge"] + seen["pool"]] == [5.0, 5.0]
    report = json.loads((tmp_path / "wide" / "polish.json").read_text())
    assert report["settings"]["robot_config"] == str(variant)
    metadata = load_policy(tmp_path / "wide" / "policy.npz").metadata
    assert metadata["polished"]["settings"]["robot_config"] == str(variant)
    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--robot-config", str(variant),
                     "--out", str(tmp_path / "cli")]) == 0
    assert f"for the controller of {variant}" in capsys.readouterr().out
    assert cli.main(["polish", str(run), "--robot-config", str(REPO / "config" / "acrobot.yaml"),
                     "--out", str(tmp_path / "refused")]) == 2
    assert "is for the acrobot" in capsys.readouterr().err and not (tmp_path / "refused").exists()


def test_basis_functions_can_be_added_on_the_post_disturbance_starts_without_changing_the_policy(run, tmp_path,
                                                                                               monkeypatch):
    """polish.add_basis / --add-basis N: N more basis functions centred on the pool's states with weight 0 -- the
    same torques everywhere -- before the polish; in rounds, before the first round only."""
    from mcpilco_core.policy import features

    source = load_source(run)
    policy = load_policy(source.policy_file)
    states = np.random.default_rng(0).uniform(-8, 8, size=(30, 4))
    grown = polish_module.with_added_basis(policy, states, 12, np.random.default_rng(1))
    assert grown.centers.shape == (len(policy.weights) + 12, 6) and np.all(grown.weights[-12:] == 0.0)
    new_centres = grown.centers[-12:]
    assert all(np.any(np.all(np.isclose(features(states), c), axis=1)) for c in new_centres)
    assert len({tuple(c) for c in new_centres}) == 12                      # without replacement while enough
    probe = np.random.default_rng(2).uniform(-10, 10, size=(200, 4))
    np.testing.assert_allclose([grown(x) for x in probe], [policy(x) for x in probe], rtol=1e-12, atol=1e-15)
    assert polish_module.with_added_basis(policy, states[:3], 5, np.random.default_rng(1)).centers.shape[0] == \
        len(policy.weights) + 5                                             # with replacement when too few
    with pytest.raises(ValueError, match="add_basis must be >= 0"):
        PolishSettings(add_basis=-1)

    assert cli.main(["polish", str(run), "--steps", "2", "--particles", "8", "--add-basis", "7",
                     "--out", str(tmp_path / "grown")]) == 0
    polished = load_policy(tmp_path / "grown" / "policy.npz")
    assert len(polished.weights) == len(policy.weights) + 7
    assert polished.metadata["polished"]["basis_added_to"] == len(policy.weights)
    scripted_judge(monkeypatch, [0.1, 0.2, 0.2, 0.3])                        # round 1 gains, round 2 gains
    settings = PolishSettings(steps=2, particles=8, snapshot_every=2, rounds=2, add_basis=4)
    result = polish_module.polish_rounds(source, settings, tmp_path / "rounds", progress=False)
    assert len(load_policy(tmp_path / "rounds" / "round_1" / "policy.npz").weights) == len(policy.weights) + 4
    assert len(load_policy(result.policy_file).weights) == len(policy.weights) + 4   # round 2 added none


def test_bench_subnormals_times_a_step_both_ways_on_the_runs_model_and_they_agree(run, tmp_path, capsys):
    """benchmarks/bench_subnormals.py: one optimisation step on the run's newest model, flushed and IEEE; flushing
    the kernel's subnormal tails changes the cost by nothing that float32 resolves (no timing is asserted)."""
    from _bench_helpers import load_benchmark

    out = tmp_path / "subnormals.json"
    assert load_benchmark("bench_subnormals").main([str(run), "--particles", "8", "--horizon", "0.2",
                                                    "--steps", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["horizon_steps"] == 10 and result["step_s_flushed"] > 0 and result["step_s_ieee"] > 0
    assert result["cost_difference"] <= 1e-4
    assert "flushed" in capsys.readouterr().out
