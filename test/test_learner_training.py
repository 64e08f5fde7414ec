"""End-to-end: tiny MC-PILCO trainings (config/train_tiny.yaml), resume, run directory, CLI."""

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mcpilco_core.config import load_robot_config
from mcpilco_core.learning.learner import Learner, load_train_config
from mcpilco_core.learning.runs import RunDirectory, RunError, train
from mcpilco_core.policy import import_realaigym, load_policy
from mcpilco_ros import cli

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "config" / "train_tiny.yaml"

pytestmark = pytest.mark.timeout(120)


def test_tiny_training_writes_run_directory_and_cost_decreases(tmp_path):
    config = load_train_config(TINY, "pendubot")
    records = train(config, tmp_path / "run")
    assert [r.index for r in records] == [0, 1]
    cost = np.asarray(records[1].optimization.cost)
    assert cost[-5:].mean() < cost[:5].mean()
    root = tmp_path / "run"
    for name in ("run.json", "train_config.yaml", "robot_config.yaml", "log.txt", "policy.npz",
                 "learning_curves.png", "trials/trial_000/data.npz", "trials/trial_001/model.npz",
                 "trials/trial_001/policy.npz", "trials/trial_001/optimization.npz"):
        assert (root / name).is_file(), name
    meta = json.loads((root / "run.json").read_text())
    policy = load_policy(root / "policy.npz", robot="pendubot")
    assert policy.metadata["run_id"] == meta["run_id"] and policy.metadata["config_hash"] == meta["config_hash"]
    assert "trial 1 complete" in (root / "log.txt").read_text()
    data = np.load(root / "trials/trial_001/data.npz")
    assert np.all(data["u"][:, 1] == 0.0)  # the passive joint never gets torque
    copied = load_robot_config(root / "robot_config.yaml")  # self-contained: the plant models file came along
    assert copied.plant == config.robot.plant
    reloaded = RunDirectory(root).load_config()            # the run's own copies load as the same configuration
    assert reloaded.robot.fingerprint() == config.robot.fingerprint()
    assert replace(reloaded, source="", robot=config.robot) == replace(config, source="")
    with pytest.raises(RunError, match="--resume"):
        train(config, root)


RESUME = REPO / "test" / "data" / "train_tiny_resume.yaml"   # pool, evaluation seeds, parallel: processes


def _train_command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mcpilco_ros.cli", "train", "--robot", "pendubot", "--config", str(RESUME),
            "--out", str(out), *extra]


def _kill_during_optimisation(out: Path, trial: int, min_step: int = 5) -> str:
    """Start ``mcpilco train``, wait until trial ``trial``'s optimisation progress bar shows ``min_step`` steps
    on stderr, SIGKILL the process group (the trainer and its particle worker); returns the stderr read."""
    proc = subprocess.Popen(_train_command(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    pattern = re.compile(rb"trial %d policy:\s+\d+%%\|[^|]*\|\s*(\d+)/" % trial)
    seen = b""
    try:
        while True:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"mcpilco train ended before trial {trial}'s optimisation:\n"
                                     + seen.decode(errors="replace")[-3000:])
            seen += chunk
            if any(int(m.group(1)) >= min_step for m in pattern.finditer(seen[-4096:])):
                break
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    return seen.decode(errors="replace")


def _train_to_the_end(out: Path, *extra: str) -> None:
    done = subprocess.run(_train_command(out, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]


@pytest.mark.timeout(400)   # three training processes: 88 s on an idle 2-core machine, over 120 s on a loaded one
def test_sigkill_during_optimisation_then_resume_equals_uninterrupted_run(tmp_path):
    """SIGKILL ``mcpilco train`` in trial 2's optimisation (post-disturbance pool, evaluation seeds and
    ``parallel: processes`` on), ``--resume`` in a fresh process: every trial's files equal those of an
    uninterrupted run exactly (policies, learning curves, trajectories, models, pools, scores)."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    _train_to_the_end(full)
    _kill_during_optimisation(cut, trial=2)
    run = RunDirectory(cut)
    assert run.completed_trials() == [0, 1]
    assert not run.trial_path(2).exists()                    # killed before trial 2 was saved
    _train_to_the_end(cut, "--resume")
    assert "resumed after trial 1" in (cut / "log.txt").read_text()
    assert RunDirectory(cut).completed_trials() == [0, 1, 2]
    config = load_train_config(RESUME, "pendubot")
    assert config.parallel == "processes" and config.evaluation_seeds and config.initial_state.disturbance_fraction > 0
    for k in range(3):
        a, b = RunDirectory(full).trial_path(k), RunDirectory(cut).trial_path(k)
        names = sorted(p.name for p in a.iterdir())
        assert names == sorted(p.name for p in b.iterdir())
        if k:
            assert {"policy.npz", "model.npz", "optimization.npz"} <= set(names)
            assert len(np.load(a / "disturbance_states.npy")) > 0    # the pool grew
        for name in names:
            if name.endswith(".npy"):
                np.testing.assert_array_equal(np.load(a / name), np.load(b / name), err_msg=f"trial {k} {name}")
            elif name.endswith(".npz"):
                with np.load(a / name) as da, np.load(b / name) as db:
                    keys = set(da.files) - {"wall_time"}
                    assert keys == set(db.files) - {"wall_time"}, name
                    for key in sorted(keys):
                        va, vb = da[key], db[key]
                        if name == "policy.npz" and key == "metadata":   # the runs' ids differ, nothing else
                            va, vb = (json.loads(str(v)) for v in (va, vb))
                            assert va.pop("run_id") != vb.pop("run_id")
                            assert va == vb
                            continue
                        np.testing.assert_array_equal(va, vb, err_msg=f"trial {k} {name}[{key}]")
        sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
        for s in (sa, sb):
            s.pop("timings_s")
        assert sa == sb
    pa, pb = load_policy(full / "policy.npz"), load_policy(cut / "policy.npz")
    for name in ("centers", "log_lengthscales", "weights"):
        np.testing.assert_array_equal(getattr(pa, name), getattr(pb, name))


def test_snapshots_are_judged_on_the_learners_identified_plant_and_the_best_is_the_trials_policy(tmp_path):
    """optimizer.snapshot_every: the trial's policy is the snapshot the protocol on the learner's own plant (prior,
    friction and Ir identified from the trials; not the robot's profile) scored best, and the run records them."""
    from mcpilco_core.learning.model import DynamicsModel
    from mcpilco_core.learning.protocol import on_model, protocol_scores

    base = load_train_config(TINY, "pendubot")
    config = replace(base, robot_profile="hardware_proxy", gp=replace(base.gp, identify=True),
                     optimizer=replace(base.optimizer, snapshot_every=10, snapshot_seeds=(3000, 3001),
                                       snapshot_seconds=3.0))
    records = train(config, tmp_path / "run")
    opt = records[1].optimization
    assert [s for s, _ in opt.snapshots] == [0, 10, 20, 30, 40] and opt.kept_step is not None
    scores = dict(opt.snapshots)
    assert scores[opt.kept_step] == max(scores.values())
    model = DynamicsModel(config.model_robot, config.gp)
    model.load_arrays(records[1].model_arrays, "cpu", torch.float64)
    assert model.config.plant.cf != config.robot.plant.cf          # the identified plant judged, not the prior
    path = tmp_path / "run" / "trials" / "trial_001" / "policy.npz"
    robot, profile = on_model(config, model)
    assert profile == "nominal"                                     # no gp.identify_robot: ideal sensors and motors
    again = protocol_scores(config, path, robot, (3000, 3001), 3.0, profile)
    assert float(np.mean(again)) == pytest.approx(scores[opt.kept_step], abs=1e-12)
    assert protocol_scores(config, path, robot, (3000, 3001), 3.0, profile, processes=2) == again  # judge_processes
    summary = json.loads((tmp_path / "run" / "trials" / "trial_001" / "summary.json").read_text())
    assert summary["kept_step"] == opt.kept_step and len(summary["snapshots"]) == 5
    assert summary["timings_s"]["snapshot_judge"] > 0
    reloaded = RunDirectory(tmp_path / "run").load_trial(1, "pendubot").optimization
    assert reloaded.snapshots == opt.snapshots and reloaded.kept_step == opt.kept_step


def test_fresh_snapshot_seeds_give_each_trial_a_judge_of_its_own(tmp_path, monkeypatch):
    """optimizer.snapshot_fresh: trial k judges its snapshots, the warm start included, on the snapshot seeds shifted
    by (k - 1) times their count, so a later trial's bar is not the earlier trial's maximum on the same seeds."""
    from mcpilco_core.learning import protocol

    seen: list[tuple[int, ...]] = []
    real = protocol.protocol_judge

    def recording_judge(config, model, seeds, seconds, processes=1):
        seen.append(tuple(seeds))
        return real(config, model, seeds, seconds, processes)

    monkeypatch.setattr(protocol, "protocol_judge", recording_judge)
    base = load_train_config(TINY, "pendubot")
    snap = replace(base.optimizer, snapshot_every=20, snapshot_seeds=(3000, 3001), snapshot_seconds=2.0)
    path = tmp_path / "train.yaml"
    path.write_text(f"base: {TINY}\noptimizer: {{snapshot_every: 20, snapshot_fresh: true}}\n")
    assert load_train_config(path, "pendubot").optimizer.snapshot_fresh
    assert snap.judge_seeds(3) == (3000, 3001) and replace(snap, snapshot_fresh=True).judge_seeds(3) == (3004, 3005)
    with pytest.raises(ValueError, match="count from 1"):
        snap.judge_seeds(0)
    records = train(replace(base, trials=3, optimizer=replace(snap, snapshot_fresh=True)), tmp_path / "run")
    assert seen == [(3000, 3001), (3002, 3003)]
    assert all(r.optimization.snapshots[0][0] == 0 for r in records[1:])      # each start judged on its seeds
    seen.clear()
    train(replace(base, trials=3, optimizer=snap), tmp_path / "same")
    assert seen == [(3000, 3001), (3000, 3001)]


def test_several_first_starts_keep_the_best_judged_one_and_later_trials_warm_start_from_it(tmp_path):
    """optimizer.starts_first: the first optimisation runs from that many random policies (start 0 = the trial's
    own generator, as with one start) and keeps the one whose best snapshot scored highest."""
    base = load_train_config(TINY, "pendubot")
    snap = replace(base.optimizer, snapshot_every=20, snapshot_seeds=(3000,), snapshot_seconds=3.0)
    config = replace(base, trials=3, optimizer=replace(snap, starts_first=3))
    records = train(config, tmp_path / "run")
    first = records[1].optimization
    assert len(first.start_scores) == 3 and first.kept_score == max(first.start_scores)
    assert records[2].optimization.start_scores == []             # later trials warm-start: one start
    summary = json.loads((tmp_path / "run" / "trials" / "trial_001" / "summary.json").read_text())
    assert summary["start_scores"] == first.start_scores
    assert summary["timings_s"]["optimization"] > 0
    one = train(replace(base, trials=2, optimizer=snap), tmp_path / "one")[1].optimization
    assert one.start_scores == [] and first.start_scores[0] == one.kept_score   # start 0 is the one-start run


def test_a_warm_start_judged_below_restart_below_races_a_fresh_random_policy(tmp_path, monkeypatch):
    """optimizer.restart_below: from trial restart_from on, a warm-started trial whose kept snapshot is judged below
    the bar also optimises a fresh random policy (its own generator) on the same model; the better-judged one is
    kept and both scores are recorded; above the bar, or before restart_from, one start as before."""
    import mcpilco_core.learning.learner as learner_module

    base = load_train_config(TINY, "pendubot")
    snap = replace(base.optimizer, snapshot_every=20, snapshot_seeds=(3000,), snapshot_seconds=3.0)
    assert not replace(snap, restart_below=0.5).restarts(1, 0.1)                     # restart_from 2
    assert replace(snap, restart_below=0.5).restarts(2, 0.1) and not replace(snap, restart_below=0.5).restarts(2, 0.6)
    assert not snap.restarts(5, 0.0)                                                 # 0: never
    seen: list[torch.Tensor] = []
    real_random = learner_module.TorchPolicy.random

    def random_policy(*args, **kwargs):
        policy = real_random(*args, **kwargs)
        seen.append(policy.weights.detach().clone())
        return policy

    monkeypatch.setattr(learner_module.TorchPolicy, "random", staticmethod(random_policy))
    always = replace(snap, restart_below=1.0, restart_from=3)           # every trial from 3 on is below 1.0
    records = train(replace(base, trials=5, optimizer=always), tmp_path / "run")   # trial 0 explores
    assert len(seen) == 1 + 2                       # trial 1's first policy, then one fresh policy in trials 3 and 4
    assert records[2].optimization.start_scores == []                              # trial 2: before restart_from
    for record in records[3:]:
        scores = record.optimization.start_scores
        assert len(scores) == 2 and record.optimization.kept_score == max(scores)
    summary = json.loads((tmp_path / "run" / "trials" / "trial_003" / "summary.json").read_text())
    assert summary["start_scores"] == records[3].optimization.start_scores
    plain = train(replace(base, trials=4, optimizer=snap), tmp_path / "plain")
    assert records[3].optimization.start_scores[0] == plain[3].optimization.kept_score   # start 0: the warm start


def test_cli_train_and_export(tmp_path):
    out = tmp_path / "cli_run"
    assert cli.main(["train", "--robot", "pendubot", "--config", str(TINY), "--out", str(out)]) == 0
    assert cli.main(["train", "--robot", "pendubot", "--config", str(TINY), "--out", str(out), "--resume"]) == 0
    assert cli.main(["train", "--robot", "pendubot", "--config", str(TINY), "--out", str(out)]) == 2
    assert cli.main(["train", "--robot", "acrobot", "--config", str(TINY), "--out", str(tmp_path / "x")]) == 2
    target = tmp_path / "policy.np"
    assert cli.main(["export", str(out / "policy.npz"), "--realaigym", str(target)]) == 0
    exported = import_realaigym(target, "pendubot")
    original = load_policy(out / "policy.npz")
    x = np.random.default_rng(0).normal(size=(20, 4))
    np.testing.assert_array_equal(exported(x), original(x))


def test_optimizer_skips_steps_with_escaped_particles_rolls_back_when_they_persist_and_never_raises(monkeypatch):
    """A divergence (escaped particles 21 steps in a row) rolls the parameters back to a checkpoint with half the
    learning rate; when it persists, the optimisation stops as diverged with finite parameters instead of ending the
    run (a full-size acrobot run and its session ended on that error at trial 9)."""
    import torch

    from mcpilco_core.learning import optimizer as opt_module
    from mcpilco_core.learning.learner import TrialRecord, initial_distribution, trial_generators
    from mcpilco_core.learning.model import NonFiniteParticlesError
    from mcpilco_core.learning.runs import _describe
    from mcpilco_core.learning.torch_policy import TorchPolicy

    config = load_train_config(TINY, "pendubot")
    learner = Learner(config)
    learner.exploration_trial()
    rng, gen = trial_generators(config.seed, 1)
    learner.model.fit(learner.data, rng)
    policy = TorchPolicy.random(config.num_basis, config.robot.u_max, gen)
    start = [p.detach().clone() for p in policy.parameters()]
    sampler = initial_distribution(config, 1, learner.pool).sampler("cpu", torch.float32)
    real_rollout, calls = opt_module.rollout, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) % 3 == 0:
            raise NonFiniteParticlesError("1 non-finite particle states; first at step 3 (1 of 16 particles)")
        return real_rollout(*args, **kwargs)

    monkeypatch.setattr(opt_module, "rollout", flaky)
    result = opt_module.optimize_policy(policy, learner.model, sampler, 8, 5, config.cost, config.optimizer, 12, gen,
                                        progress=False)
    assert result.skipped_steps == 4 and result.steps == 8 and not result.rollbacks
    assert all(bool(torch.isfinite(p).all()) for p in policy.parameters())

    # escapes from the 120th call on for 21 calls: one rollback to the checkpoint of step 50, half the learning rate
    calls.clear()
    seen: dict[int, list[torch.Tensor]] = {}

    def escaping_for_a_while(*args, **kwargs):
        calls.append(1)
        if len(calls) == 51:                                  # the parameters after 50 successful steps
            seen[50] = [p.detach().clone() for p in policy.parameters()]
        if 120 <= len(calls) < 120 + opt_module.MAX_SKIPPED_IN_A_ROW + 1:
            raise NonFiniteParticlesError("1 non-finite particle states; first at step 3 (1 of 16 particles)")
        if len(calls) == 120 + opt_module.MAX_SKIPPED_IN_A_ROW + 1:
            seen[-1] = [p.detach().clone() for p in policy.parameters()]    # just after the rollback
        return real_rollout(*args, **kwargs)

    policy = TorchPolicy.random(config.num_basis, config.robot.u_max, gen)
    monkeypatch.setattr(opt_module, "rollout", escaping_for_a_while)
    settings = replace(config.optimizer, patience=10**6)       # no plateau: only the rollback halves
    stepped_at: list[float] = []                               # the rate each Adam step really used

    class RecordingAdam(torch.optim.Adam):
        def step(self, *args, **kwargs):
            stepped_at.append(self.param_groups[0]["lr"])
            return super().step(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "Adam", RecordingAdam)
    result = opt_module.optimize_policy(policy, learner.model, sampler, 8, 5, config.cost, settings, 160, gen,
                                        progress=False)
    assert [r[:2] for r in result.rollbacks] == [(119, 50)] and "in a row" in result.rollbacks[0][2]
    assert stepped_at == result.lr          # the halved rate is the one the steps after the rollback used
    for before, after in zip(seen[50], seen[-1]):
        torch.testing.assert_close(before, after, rtol=0, atol=0)
    assert set(result.lr[:119]) == {settings.lr} and set(result.lr[119:]) == {settings.lr * settings.lr_factor}
    assert result.stop_reason == "step cap" and result.steps == 160 - opt_module.MAX_SKIPPED_IN_A_ROW - 1
    assert result.to_arrays()["rollbacks"].tolist() == [[119, 50]]
    summary = TrialRecord(1, None, np.zeros(4), optimization=result).summary()
    assert [r[:2] for r in summary["optimization_rollbacks"]] == [[119, 50]]

    def broken(*args, **kwargs):
        raise NonFiniteParticlesError("escaped")

    policy = TorchPolicy.random(config.num_basis, config.robot.u_max, gen)
    start = [p.detach().clone() for p in policy.parameters()]
    monkeypatch.setattr(opt_module, "rollout", broken)
    result = opt_module.optimize_policy(policy, learner.model, sampler, 8, 5, config.cost, config.optimizer, 500, gen,
                                        progress=False)
    assert result.stop_reason.startswith("diverged: escaped (21 steps in a row)") and result.steps == 0
    assert len(result.rollbacks) == opt_module.MAX_ROLLBACKS + 1
    for before, after in zip(start, policy.parameters()):       # the starting policy, unharmed
        torch.testing.assert_close(before, after.detach(), rtol=0, atol=0)
    assert "0 steps (diverged: escaped" in _describe(TrialRecord(5, None, np.zeros(4), optimization=result))


def test_an_initial_policy_starts_the_first_optimisation_and_travels_with_the_run(tmp_path):
    """``policy.initial`` (relative to the training file, kept through ``base``): the first optimisation starts
    from that policy, not a random one, and the run keeps a copy so it reloads on its own."""
    from mcpilco_core.config import ConfigError
    from mcpilco_core.learning.torch_policy import TorchPolicy

    (tmp_path / "sub").mkdir()
    start = tmp_path / "sub" / "start.npz"
    start.write_bytes((REPO / "policies" / "archive" / "pendubot_rk4_trial11.npz").read_bytes())   # 3 N m, as tiny
    tiny = tmp_path / "sub" / "tiny.yaml"
    tiny.write_text(f"base: {TINY}\npolicy: {{initial: start.npz}}\noptimizer: {{max_steps_first: 1}}\n")
    derived = tmp_path / "derived.yaml"                                   # inherits the path from its base
    derived.write_text("base: sub/tiny.yaml\ntrials: 2\n")
    config = load_train_config(derived, "pendubot")
    assert config.initial_policy == str(start.resolve())
    learner = Learner(config)
    learner.exploration_trial()
    policy, _, _, _, _ = learner.fit_and_optimize(1, "trial 1")
    given = TorchPolicy.from_numpy(load_policy(start, robot="pendubot"), config.torch_dtype)
    moved = float((learner.policy.weights.detach() - given.weights.detach()).abs().max())
    assert 0.0 < moved < 0.1                                               # one small step away from it
    records = train(replace(config, trials=2), tmp_path / "run")
    assert (tmp_path / "run" / "initial_policy.npz").read_bytes() == start.read_bytes()
    assert RunDirectory(tmp_path / "run").load_config().initial_policy == str(tmp_path / "run" / "initial_policy.npz")
    assert len(records) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {TINY}\npolicy: {{initial: nowhere.npz}}\n")
    with pytest.raises(ConfigError, match="policy.initial"):
        load_train_config(bad, "pendubot")
    acro = tmp_path / "acro.yaml"
    acro.write_text(f"base: {TINY}\npolicy: {{initial: {REPO / 'policies' / 'acrobot.npz'}}}\n")
    with pytest.raises(ConfigError, match="policy.initial"):
        load_train_config(acro, "pendubot")
    wider = tmp_path / "wider.yaml"                   # bounded at 6 N m where the recipe trains at 3: refused
    wider.write_text(f"base: {TINY}\npolicy: {{initial: {REPO / 'policies' / 'pendubot.npz'}}}\n")
    with pytest.raises(ConfigError, match="bounded at 6 N m, policy.u_max is 3 N m"):
        load_train_config(wider, "pendubot")


def test_offline_exploration_draws_the_controller_nodes_torques():
    """Trial 0 offline commands exactly what the controller node's first exploration run commands for the same
    seed (its own generator trial_rng(seed, 0), not the one x0 was drawn from): offline and session explore alike."""
    from mcpilco_core.control.exploration import ExplorationController, trial_rng

    config = load_train_config(TINY, "pendubot")
    learner = Learner(config)
    record = learner.exploration_trial()
    u_cmd = np.asarray(record.trajectory.u_cmd)
    explorer = ExplorationController(config.robot, config.exploration_amplitude, trial_rng(config.seed, 0))
    expected = np.array([explorer.step(np.zeros(4), k * config.robot.control_period) for k in range(len(u_cmd))])
    np.testing.assert_array_equal(u_cmd, expected)
    assert np.all(u_cmd[:, 1] == 0.0) and len(np.unique(u_cmd[:, 0])) > 10


def test_trials_start_from_the_box_never_from_the_pool(tmp_path):
    """Every trial starts where ``trial_start_state`` says (what ``mcpilco session`` puts the simulated robot at),
    a draw from the curriculum box, even when all particles start from the post-disturbance pool: a robot cannot
    be put down at a moving state."""
    from mcpilco_core.learning.learner import trial_start_state

    config = load_train_config(TINY, "pendubot")
    config = replace(config, initial_state=replace(config.initial_state, disturbance_fraction=1.0,
                                                   disturbance_from_trial=1, disturbance_seeds=(1000,)))
    records = train(replace(config, trials=2), tmp_path / "run")
    for record in records:
        np.testing.assert_array_equal(record.x0, trial_start_state(config, record.index))
    assert np.all(np.abs(records[1].x0[2:]) <= config.initial_state.x_max[2:])   # the box: at most 0.5 rad/s


def test_a_rollback_returns_to_the_older_checkpoint_which_becomes_the_only_one():
    """Kills mutation B7 (both checkpoints kept after a rollback): the newer checkpoint may lie on the way out, so
    once rolled back past it, a later rollback returns to the older one again, never to it."""
    import torch

    from mcpilco_core.learning.optimizer import Checkpoints
    from mcpilco_core.learning.torch_policy import TorchPolicy

    policy = TorchPolicy.random(3, 2.0, torch.Generator().manual_seed(0))
    params: dict[int, list[torch.Tensor]] = {}

    def take(step: int) -> None:
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(1.0)                                     # the parameters move between checkpoints
        params[step] = [p.detach().clone() for p in policy.parameters()]
        checkpoints.take(step)

    def holds(step: int) -> bool:
        return all(torch.equal(p.detach(), q) for p, q in zip(policy.parameters(), params[step]))

    checkpoints = Checkpoints(policy)
    params[0] = [p.detach().clone() for p in policy.parameters()]
    take(50)
    take(100)
    with torch.no_grad():
        policy.weights.add_(5.0)                                # diverging after step 100
    assert checkpoints.roll_back() == 50 and holds(50)          # the older of the last two, not step 100
    assert [step for step, _ in checkpoints.kept] == [50]
    assert checkpoints.roll_back() == 50 and holds(50)          # again at once: the same
    take(150)
    assert checkpoints.roll_back() == 50 and holds(50)          # step 100 is gone for good
    take(200)
    take(250)
    assert checkpoints.roll_back() == 200 and holds(200)


def test_the_plateau_monitor_restarts_after_a_rollback(monkeypatch):
    """Kills mutation B9 (the plateau monitor not reset after a rollback): the first step after a rollback starts
    the smoothed ratio afresh (inf, as the first step of the optimisation), never comparing its cost with the
    diverging steps before the rollback. A stub rollout: no model."""
    import torch

    from mcpilco_core.learning import optimizer as opt_module
    from mcpilco_core.learning.cost import CostSettings
    from mcpilco_core.learning.model import NonFiniteParticlesError
    from mcpilco_core.learning.optimizer import OptimizerSettings
    from mcpilco_core.learning.torch_policy import TorchPolicy

    calls = []

    def escaping_for_a_while(model, policy, x0, steps, *args, **kwargs):
        calls.append(1)
        if 5 <= len(calls) < 5 + opt_module.MAX_SKIPPED_IN_A_ROW + 1:
            raise NonFiniteParticlesError("1 non-finite particle states; first at step 3 (1 of 8 particles)")
        return x0 + 0.1 * policy(x0)[None, :, None] * torch.arange(steps + 1.0)[:, None, None]

    monkeypatch.setattr(opt_module, "rollout", escaping_for_a_while)
    gen = torch.Generator().manual_seed(0)
    policy = TorchPolicy.random(3, 2.0, gen)
    settings = OptimizerSettings(patience=10**6)
    result = opt_module.optimize_policy(policy, None, lambda n, g: torch.randn(n, 4, generator=g), 8, 5,
                                        CostSettings(), settings, 30, gen, progress=False)
    assert [r[:2] for r in result.rollbacks] == [(4, 0)] and result.steps == 30 - 21
    assert result.ratio[0] == result.ratio[4] == float("inf")   # the first step, and the first after the rollback
    assert all(np.isfinite(r) for r in result.ratio[1:4] + result.ratio[5:])
