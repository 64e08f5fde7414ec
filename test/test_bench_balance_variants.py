"""benchmarks/bench_balance_variants.py: the PWM shake averages to the LQR's torque, the schedule scales by level, the
damped design reduces to the config's LQR without damping, the MPPI never pushes the passive joint, bad arguments
are refused."""

from __future__ import annotations

import numpy as np
import pytest
from _bench_helpers import load_benchmark


def test_the_pwm_shake_averages_to_the_command_at_full_amplitude():
    bench = load_benchmark("bench_balance_variants")
    assert bench.triangle(0.0) == pytest.approx(0.0) and bench.triangle(0.25) == pytest.approx(1.0)
    assert bench.triangle(0.75) == pytest.approx(-1.0)
    phases = (np.arange(10000) + 0.5) / 10000
    for u in (-5.0, -1.5, 0.0, 2.0, 5.5):
        values = [bench.pwm(u, c, 6.0) for c in phases]
        assert set(values) == {-6.0, 6.0} and np.mean(values) == pytest.approx(u, abs=2e-3)


def test_the_schedule_and_the_damped_design_against_the_config_lqr():
    bench = load_benchmark("bench_balance_variants")
    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control import build_controller

    config = load_robot_config(bench.TUNED)
    ref = build_controller(config)
    err = np.array([0.01, -0.02, 0.05, 0.1])
    u = ref._balance_torque(err, 0.0, 0.0)
    scheduled = bench.ScheduledGains(config, ref.design, ref.rho, None, far=2.0, near=0.5, level=1.0)
    assert scheduled._balance_torque(err, 0.5 * ref.rho, 0.0) == pytest.approx(0.5 * u)
    assert scheduled._balance_torque(err, 2.0 * ref.rho, 0.0) == pytest.approx(2.0 * u)
    assert np.allclose(bench.damped_design_gains(config, 0.0), ref.design.K)    # model_1.1 has no friction
    damped = bench.damped_design_gains(config, 0.3)
    assert damped[0].tolist() == [0.0] * 4 and not np.allclose(damped, ref.design.K)


def test_the_mppi_plans_on_the_actuated_joint_only():
    bench = load_benchmark("bench_balance_variants")
    import argparse

    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control import build_controller
    from mcpilco_core.plant import GOAL, DoublePendulum

    config = load_robot_config(bench.TUNED)
    ref = build_controller(config)
    args = argparse.Namespace(samples=8, knot=0.02, dt=0.005, horizon=0.1, sigma=3.0, lam=0.03, period=0.02, seed=0)
    mppi = bench.Mppi(DoublePendulum(config.plant), ref.design.S, np.diag(config.lqr.Q_diag), args)
    x = GOAL + np.array([0.05, -0.05, 0.2, 0.0])
    torques = [mppi.step(x, 0.002 * k) for k in range(25)]
    assert all(t[0] == 0.0 and abs(t[1]) <= 6.0 for t in torques)
    assert len({round(float(t[1]), 12) for t in torques[:10]}) == 1               # one knot held 20 ms
    mppi.reset()
    assert np.array_equal(mppi.step(x, 0.0), torques[0])                           # seeded: the same plan again


@pytest.mark.parametrize("argv", [[], ["--mppi", "--samples", "0"], ["--mppi", "--lam", "0"],
                                  ["--mppi", "--knot", "0.001"]])
def test_bad_arguments_are_refused(argv):
    bench = load_benchmark("bench_balance_variants")
    with pytest.raises(SystemExit):
        bench.main(argv)
