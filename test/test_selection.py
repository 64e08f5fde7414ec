"""``mcpilco select``: ranking a run's trial policies on its newest model, without the robot, and the optional
robot check of the best few (counted robot time)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from mcpilco_core.control import build_controller
from mcpilco_core.evaluation import evaluate_seed
from mcpilco_core.learning import learner
from mcpilco_core.learning.learner import load_train_config
from mcpilco_core.learning.model import DynamicsModel
from mcpilco_core.learning.runs import train
from mcpilco_core.learning.selection import ModelProtocol, RobotCheck, Selection, select_policy
from mcpilco_core.policy import load_policy, save_policy
from mcpilco_core.simulation import SimulatedRobot
from mcpilco_ros import cli

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(180)


def tiny_run(root: Path, **changes) -> Path:
    """A finished tiny run (train_tiny.yaml, 4 trials unless ``changes`` say otherwise) whose particles start from
    post-disturbance states from trial 1 on; ``changes`` replace top-level keys of the training file."""
    data = yaml.safe_load((REPO / "config" / "train_tiny.yaml").read_text())
    data.update(robot_config=str(REPO / "config" / "pendubot.yaml"), horizon=0.3, particles=8, trial_duration=0.4,
                trials=4, exploration={"duration": 0.6, "amplitude": 3.0},
                gp={"fit_steps": 3, "fit_points": 30, "max_points": 20},
                optimizer={"max_steps_first": 3, "max_steps": 3, "patience": 3, "smoothing": 0.9},
                policy={"num_basis": 5, "u_max": 3.0},
                initial_state={"k_m": 5, "K": 10, "disturbance_fraction": 0.5, "disturbance_from_trial": 1,
                               "disturbance_seeds": [1000], "pool_seeds_per_trial": 1})
    data.update(changes)
    (root / "train.yaml").write_text(yaml.safe_dump(data))
    train(load_train_config(root / "train.yaml"), root / "run")
    return root / "run"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("selection"))


def test_every_trial_policy_is_ranked_on_the_newest_model_without_the_robot(run, tmp_path, monkeypatch):
    def no_robot(*args, **kwargs):
        raise AssertionError("selection ran the robot")

    monkeypatch.setattr(learner, "run_on_robot", no_robot)
    monkeypatch.setattr(SimulatedRobot, "step", no_robot)
    first = select_policy(run, particles=50, seed=3, protocol=None)
    assert sorted(first.costs) == [1, 2, 3] and first.model_trial == 3      # trial 0 explores: no policy
    assert all(np.isfinite(v) and v > 0 for v in first.costs.values())
    assert first.best == min(first.costs, key=first.costs.get)
    assert select_policy(run, particles=50, seed=3, protocol=None).costs == first.costs   # same particles, noise
    # the same policy file in two trials costs exactly the same; a worse one (no torque at all) costs more
    spoiled = tmp_path / "run"
    shutil.copytree(run, spoiled)
    shutil.copyfile(spoiled / "trials/trial_001/policy.npz", spoiled / "trials/trial_002/policy.npz")
    best = load_policy(run / "trials" / f"trial_{first.best:03d}" / "policy.npz")
    limp = dataclasses.replace(best, weights=np.zeros_like(best.weights))
    save_policy(limp, spoiled / "trials/trial_003/policy.npz")
    second = select_policy(spoiled, particles=50, seed=3, protocol=None)
    assert second.costs[2] == second.costs[1] == first.costs[1]
    assert second.costs[3] != first.costs[3]


def test_cli_select_writes_the_table_and_exports_the_chosen_policy(run, tmp_path, capsys):
    out = tmp_path / "chosen.npz"
    assert cli.main(["select", str(run), "--particles", "40", "--protocol-seconds", "1", "--export", str(out)]) == 0
    report = json.loads((run / "selection.json").read_text())
    chosen = report["selected_trial"]
    assert report["robot_time_s"] == 0.0 and set(report["costs"]) == {"1", "2", "3"}
    assert report["ranked_by"] == "protocol on the model" and report["ranking"][0] == chosen
    assert set(report["protocol_on_model"]["scores"]) == {"1", "2", "3"}
    assert report["policies"] == {str(k): str(run / "trials" / f"trial_{k:03d}" / "policy.npz") for k in (1, 2, 3)}
    assert out.read_bytes() == (run / "trials" / f"trial_{chosen:03d}" / "policy.npz").read_bytes()
    assert "<- selected" in capsys.readouterr().out
    assert cli.main(["select", str(run), "--particles", "0"]) == 2
    assert cli.main(["select", str(run), "--protocol-seconds", "0"]) == 2
    assert cli.main(["select", str(run), "--particles", "40", "--rank", "cost"]) == 0
    report = json.loads((run / "selection.json").read_text())
    assert report["ranked_by"] == "model cost" and report["protocol_on_model"] is None


def test_a_run_without_post_disturbance_states_is_refused_clearly(run, tmp_path, capsys):
    bare = tmp_path / "run"
    shutil.copytree(run, bare)
    for path in bare.glob("trials/*/disturbance_states.npy"):
        np.save(path, np.zeros((0, 4)))             # a run whose particles all started in the box
    assert cli.main(["select", str(bare)]) == 2
    assert "no post-disturbance states" in capsys.readouterr().err


def test_the_robot_check_runs_the_models_best_few_and_counts_their_time(run):
    check = RobotCheck(count=2, seconds=1.0, seed=7, tolerance=None)       # no confirmation: both run
    selection = select_policy(run, particles=50, seed=3, check=check, protocol=ModelProtocol((5,), 1.0))
    assert list(selection.check_scores) == selection.ranked()[:2]           # the model's best two, nothing else
    assert selection.robot_time == 2.0 and selection.check.profile == "nominal"   # the run's robot
    assert selection.best == max(selection.check_scores, key=lambda k: (selection.check_scores[k],
                                                                         -selection.ranked().index(k)))
    # each check is the protocol's first second on the run's robot: the evaluator gives the same score
    config = load_train_config(run / "train_config.yaml", robot_config=run / "robot_config.yaml")
    k = selection.ranked()[0]
    policy = load_policy(selection.files[k])
    alone = evaluate_seed(build_controller(config.robot, policy), config.robot, 7, 1.0, False, "nominal")
    assert selection.check_scores[k] == alone.score
    report = selection.to_dict()
    assert report["robot_time_s"] == 2.0 and report["robot_check"]["seconds_each"] == 1.0
    assert set(report["robot_check"]["scores"]) == {str(t) for t in selection.check_scores}


def test_the_robot_check_outranks_the_model_and_ties_go_to_the_model():
    selection = Selection("run", 3, 10, 1.0, 0, costs={1: 30.0, 2: 20.0, 3: 25.0},
                          files={1: "a", 2: "b", 3: "c"}, check=RobotCheck(2))
    assert selection.best == 2 and selection.robot_time == 0.0               # no check run yet: the model's choice
    selection.check_scores = {2: 0.4, 3: 0.6}
    assert selection.best == 3 and selection.robot_time == 40.0
    selection.check_scores = {2: 0.5, 3: 0.5}
    assert selection.best == 2                                                 # a tie: the lower model cost


@pytest.mark.parametrize("count, seconds, seed, tolerance", [(0, 20.0, 0, 0.1), (2, 0.0, 0, 0.1), (2, 20.0, -1, 0.1),
                                                            (2, 20.0, 0, -0.1), (2, 20.0, 0, float("nan"))])
def test_a_bad_robot_check_is_refused(count, seconds, seed, tolerance):
    with pytest.raises(ValueError, match="robot check"):
        RobotCheck(count, seconds, seed, None, tolerance)


def test_the_check_stops_at_the_first_candidate_the_robot_confirms():
    """In rank order: a candidate whose robot score falls more than the tolerance below its model score is passed
    over; the first within it is chosen, even over a later one with a higher robot score."""
    selection = Selection("run", 3, 10, 1.0, 0, costs={1: 30.0, 2: 20.0, 3: 25.0}, files={1: "a", 2: "b", 3: "c"},
                          check=RobotCheck(3, tolerance=0.15), protocol=ModelProtocol(),
                          protocol_scores={1: 0.5, 2: 0.7, 3: 0.6})
    assert selection.ranked() == [2, 3, 1]
    selection.check_predictions, selection.check_scores = {2: 0.6}, {2: 0.2}            # fails on the robot
    assert selection.confirmed is None and selection.best == 2                         # none confirmed yet
    selection.check_predictions[3], selection.check_scores[3] = 0.6, 0.5                # within 0.15
    assert selection.confirmed == 3 and selection.best == 3 and selection.robot_time == 40.0
    selection.check_predictions[1], selection.check_scores[1] = 0.5, 0.9
    assert selection.best == 3                                                          # ranked after 3
    selection.check_scores = {2: 0.2, 3: 0.3, 1: 0.25}                                  # none confirmed
    assert selection.confirmed is None and selection.best == 3                          # the best robot score
    assert selection.to_dict()["robot_check"]["confirmed"] is None


def test_a_confirmed_first_candidate_costs_one_check(run):
    """Tolerance 1: any robot score confirms, so only the first-ranked runs on the robot; its model prediction is
    the same check simulated on the model's plant."""
    selection = select_policy(run, particles=50, seed=3, check=RobotCheck(3, 1.0, 7, tolerance=1.0),
                              protocol=ModelProtocol((5,), 1.0))
    first = selection.ranked()[0]
    assert list(selection.check_scores) == list(selection.check_predictions) == [first]
    assert selection.best == selection.confirmed == first and selection.robot_time == 1.0


def test_cli_select_with_a_robot_check_reports_the_counted_time(run, tmp_path, capsys):
    out = tmp_path / "chosen.npz"
    assert cli.main(["select", str(run), "--particles", "40", "--check", "2", "--check-seconds", "0.5",
                     "--protocol-seconds", "1", "--check-tolerance", "none", "--export", str(out)]) == 0
    report = json.loads((run / "selection.json").read_text())
    assert report["robot_time_s"] == 1.0 and len(report["robot_check"]["scores"]) == 2
    assert str(report["selected_trial"]) in report["robot_check"]["scores"]
    assert out.read_bytes() == Path(report["selected_policy"]).read_bytes()
    assert "= 1 s of robot time" in capsys.readouterr().out
    assert report["robot_checks"][0]["robot_time_s"] == 1.0 and report["robot_time_all_checks_s"] == 1.0
    # a later select without a check rewrites selection.json but keeps the check's robot time counted
    assert cli.main(["select", str(run), "--particles", "40", "--protocol-seconds", "1"]) == 0
    report = json.loads((run / "selection.json").read_text())
    assert report["robot_time_s"] == 0.0 and report["robot_time_all_checks_s"] == 1.0
    assert "robot checks of this run so far: 1 s" in capsys.readouterr().out
    # an export nobody can write is refused before anything runs (the robot check included)
    for target in (tmp_path / "no_such_folder" / "chosen.npz", run / "trials" / "trial_001" / "policy.npz", tmp_path):
        assert cli.main(["select", str(run), "--check", "1", "--export", str(target)]) == 2
        assert "error: --export" in capsys.readouterr().err
    assert json.loads((run / "selection.json").read_text())["robot_time_all_checks_s"] == 1.0
    assert cli.main(["select", str(run), "--check", "2", "--check-seconds", "0"]) == 2
    assert cli.main(["select", str(run), "--check", "2", "--check-seconds", "inf"]) == 2
    assert cli.main(["select", str(run), "--protocol-seconds", "inf"]) == 2
    assert cli.main(["select", str(run), "--check", "2", "--check-tolerance", "-0.1"]) == 2


def test_the_protocol_on_the_model_ranks_without_the_robot_and_never_reads_it(run, tmp_path, monkeypatch):
    """The protocol runs on the newest model's plant with the run's own controller; a run whose robot differs
    (hardware_proxy) gets the same scores: nothing of the robot enters. No robot time."""
    def no_robot(*args, **kwargs):
        raise AssertionError("selection ran the robot")

    monkeypatch.setattr(learner, "run_on_robot", no_robot)
    protocol = ModelProtocol((5, 6), 2.0)
    selection = select_policy(run, particles=50, seed=3, protocol=protocol)
    assert sorted(selection.protocol_scores) == [1, 2, 3] and selection.robot_time == 0.0
    assert selection.ranked() == sorted(selection.costs, key=lambda k: (-selection.protocol_scores[k],
                                                                         selection.costs[k], -k))
    assert selection.best == selection.ranked()[0]
    config = load_train_config(run / "train_config.yaml", robot_config=run / "robot_config.yaml")
    model = DynamicsModel(config.model_robot, config.gp)
    with np.load(run / "trials" / "trial_003" / "model.npz") as arrays:
        model.load_arrays({k: arrays[k] for k in arrays.files})
    on_model = dataclasses.replace(config.robot, plant=model.config.plant)
    k = selection.ranked()[-1]
    controller = build_controller(config.robot, load_policy(selection.files[k]))
    alone = [evaluate_seed(controller, on_model, s, 2.0, False, "nominal").score for s in (5, 6)]
    assert selection.protocol_scores[k] == pytest.approx(np.mean(alone), abs=1e-12)
    elsewhere = tmp_path / "run"
    shutil.copytree(run, elsewhere)
    data = yaml.safe_load((elsewhere / "train_config.yaml").read_text())
    data["robot_profile"] = "hardware_proxy"
    (elsewhere / "train_config.yaml").write_text(yaml.safe_dump(data))
    assert select_policy(elsewhere, particles=50, seed=3, protocol=protocol).protocol_scores == \
        selection.protocol_scores
    report = selection.to_dict()
    assert report["protocol_on_model"]["seeds"] == [5, 6] and report["protocol_on_model"]["plant"]["cf"] == \
        list(model.config.plant.cf)


def test_protocol_ranking_orders_by_score_then_cost():
    selection = Selection("run", 3, 10, 1.0, 0, costs={1: 30.0, 2: 20.0, 3: 25.0}, files={1: "a", 2: "b", 3: "c"},
                          protocol=ModelProtocol(), protocol_scores={1: 0.6, 2: 0.4, 3: 0.6})
    assert selection.ranked() == [3, 1, 2] and selection.best == 3


@pytest.mark.parametrize("seeds, seconds", [((), 60.0), ((-1,), 60.0), ((1,), 0.0)])
def test_a_bad_model_protocol_is_refused(seeds, seconds):
    with pytest.raises(ValueError, match="protocol on the model"):
        ModelProtocol(seeds, seconds)


def test_a_selection_without_export_warns_when_the_earlier_export_holds_another_trial(run, tmp_path, capsys):
    """Why: a user who exported a choice, trained on and selected again without --export would otherwise evaluate
    the stale file as the new choice (it happened: 0.081 evaluated for a run whose new choice scores 0.053)."""
    out = tmp_path / "chosen.npz"
    args = ["select", str(run), "--particles", "40", "--rank", "cost"]
    assert cli.main(args + ["--export", str(out)]) == 0
    report = json.loads((run / "selection.json").read_text())
    chosen = report["selected_trial"]
    assert report["export"] == {"path": str(out.resolve()), "trial": chosen}
    capsys.readouterr()
    assert cli.main(args + ["--export", str(out)]) == 2           # an existing file: only with --force
    assert "exists; pass --force" in capsys.readouterr().err
    assert cli.main(args + ["--export", str(out), "--force"]) == 0
    capsys.readouterr()
    assert cli.main(args) == 0                                   # same choice: the export still holds it
    assert "WARNING" not in capsys.readouterr().err
    assert json.loads((run / "selection.json").read_text())["export"] == {"path": str(out.resolve()), "trial": chosen}
    other = next(k for k in (1, 2, 3) if k != chosen)            # the file now says another trial was exported
    report = json.loads((run / "selection.json").read_text())
    report["export"]["trial"] = other
    (run / "selection.json").write_text(json.dumps(report))
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert f"still holds trial {other}" in err and f"chose trial {chosen}" in err and f"--export {out.resolve()}" in err
    (run / "selection.json").write_text("{not json")              # a damaged record: no warning, no crash
    assert cli.main(args) == 0
    assert json.loads((run / "selection.json").read_text())["export"] is None


def test_model_cost_ties_go_to_the_later_trial():
    selection = Selection("run", 3, 10, 1.0, 0, costs={1: 20.0, 2: 20.0, 3: 25.0}, files={1: "a", 2: "b", 3: "c"})
    assert selection.ranked() == [2, 1, 3] and selection.best == 2


def test_selection_json_sums_the_robot_time_of_every_check(tmp_path):
    from mcpilco_core.learning.selection import write_selection

    selection = Selection("run", 3, 10, 1.0, 0, costs={1: 20.0}, files={1: "a"})
    write_selection(selection, tmp_path / "selection.json",
                    robot_checks=[{"robot_time_s": 20.0}, {"robot_time_s": 40.0}, {"robot_time_s": 0.0}])
    record = json.loads((tmp_path / "selection.json").read_text())
    assert record["robot_time_all_checks_s"] == 60.0 and len(record["robot_checks"]) == 3


def stub_protocol(monkeypatch, scores: dict[str, list[float]]) -> list[tuple]:
    """``selection``'s protocol runs stubbed: the learner's robot a bare plant, each policy file's per-seed scores
    ``scores[path]`` (the first ``len(seeds)``); returns the calls (path, robot, seeds, seconds, profile) made."""
    from types import SimpleNamespace

    from mcpilco_core.learning import selection as module

    calls = []
    plant = SimpleNamespace(b=[0.0, 0.0], cf=[0.0, 0.0], Ir=0.0)
    monkeypatch.setattr(module, "on_model", lambda config, model: (SimpleNamespace(plant=plant), "learner"))

    def per_seed(config, path, robot, seeds, seconds, profile, processes=1):
        calls.append((path, robot, tuple(seeds), seconds, profile))
        return scores[path][: len(seeds)]

    monkeypatch.setattr(module, "protocol_scores", per_seed)
    return calls


def test_the_protocol_score_is_the_mean_over_its_seeds(monkeypatch):
    """Kills mutation Q9 (the ranking took the first seed's score only): a policy up on the first schedule alone
    ranks below one up half the time on every schedule."""
    from types import SimpleNamespace

    from mcpilco_core.learning.selection import protocol_on_model

    stub_protocol(monkeypatch, {"a": [0.9, 0.0, 0.0], "b": [0.5, 0.4, 0.6]})
    selection = Selection("run", 3, 10, 1.0, 0, costs={1: 20.0, 2: 30.0}, files={1: "a", 2: "b"})
    config = SimpleNamespace(optimizer=SimpleNamespace(judge_processes=1))
    protocol_on_model(selection, config, SimpleNamespace(robot=None), ModelProtocol((5, 6, 7), 1.0))
    assert selection.protocol_scores == {1: pytest.approx(0.3), 2: pytest.approx(0.5)}
    assert selection.ranked() == [2, 1] and selection.best == 2


def test_the_robot_check_runs_on_the_checks_robot_profile(monkeypatch):
    """Kills mutation Q8 (the check's profile ignored, the nominal robot used): the robot check runs on
    ``check.profile``; without one, on the run's; the model's prediction always on the learner's robot (a confirmed
    first candidate stops the check)."""
    from types import SimpleNamespace

    from mcpilco_core.learning.selection import check_on_robot

    calls = stub_protocol(monkeypatch, {"a": [0.4], "b": [0.6]})
    config = SimpleNamespace(robot=SimpleNamespace(name="run's robot"), robot_profile="nominal")
    for profile, expected in (("hardware_proxy", "hardware_proxy"), (None, "nominal")):
        calls.clear()
        selection = Selection("run", 3, 10, 1.0, 0, costs={1: 20.0, 2: 30.0}, files={1: "a", 2: "b"})
        check_on_robot(selection, config, RobotCheck(2, 1.0, 7, profile, tolerance=0.0), SimpleNamespace(robot=None))
        assert selection.check.profile == expected and selection.to_dict()["robot_check"]["robot_profile"] == expected
        on_robot = [c for c in calls if c[1] is config.robot]
        predicted = [c for c in calls if c[1] is not config.robot]
        assert [(c[0], c[2], c[3], c[4]) for c in on_robot] == [("a", (7,), 1.0, expected)]
        assert [(c[0], c[4]) for c in predicted] == [("a", "learner")]
        assert selection.check_scores == {1: 0.4} and selection.confirmed == selection.best == 1
