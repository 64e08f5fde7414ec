"""benchmarks/bench_selection_start.py: on a robot that is the model with 4 ms late sensors, the decisions' start
lags the robot by the delay without ``selection.predict_delay`` (the error at the due time is larger than at 4 ms
before it) and is the robot's state at the due time with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import load_benchmark
from test_policy_selection import late_model_profile, limp, selecting


def test_the_start_lags_the_robot_by_the_delay_unless_it_is_predicted(tmp_path):
    bench = load_benchmark("bench_selection_start")
    profile = late_model_profile(tmp_path)
    means = {}
    for predict in (False, True):
        folder = tmp_path / str(predict)
        folder.mkdir()
        config = selecting(folder, delay=0.004, step=0.002, lead=0.02, interval=0.1, horizon=0.5,
                           predict_delay=predict)
        policy = limp(folder / "limp.npz")        # the shipped policy banked: decisions all along
        score, errors = bench.start_errors(str(config), str(policy), str(profile), 0, duration=8.0)   # one window
        assert 0.0 <= score <= 1.0 and len(errors[0]) >= 10
        # the mean over the decisions (the median is 0: many come at rest, before the disturbance)
        means[predict] = {lag: float(np.mean(np.abs(errors[lag]).max(axis=1))) for lag in bench.LAGS}
    assert means[False][2] < 0.5 * means[False][0]        # off: the start is the robot's state 4 ms earlier
    assert means[True][0] < 0.2 * means[True][2]          # on: the robot's state at the due time
    assert means[True][0] < 0.3 * means[False][0]         # (not 0: over the delay after a disturbance window the
                                                            # reset PID's torques acted, not the held command)


def test_a_config_without_a_selection_is_refused(repo: Path):
    bench = load_benchmark("bench_selection_start")
    with pytest.raises(SystemExit, match="no selection"):
        bench.start_errors(str(repo / "config" / "acrobot.yaml"), str(repo / "policies" / "acrobot.npz"),
                           "nominal", 0, duration=0.1)


def test_bench_decision_time_times_every_decision_in_the_loop_and_in_workers(tmp_path):
    """benchmarks/bench_decision_time.py: one time per state and repeat, in the loop and with a worker."""
    bench = load_benchmark("bench_decision_time")
    config = selecting(tmp_path, lead=0.02, horizon=0.2, step=0.004)
    policy = limp(tmp_path / "limp.npz")
    for workers in (0, 1):
        times = bench.decision_times(str(config), str(policy), workers, repeats=2)
        assert len(times) == 2 * len(bench.STATES) and all(t > 0.0 for t in times)
