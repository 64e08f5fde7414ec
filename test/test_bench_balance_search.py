"""benchmarks/bench_balance_search.py: the (1+1)-ES keeps only what scores at least as well, widens its steps after a
success and narrows them after a failure; a tiny search on the design robot writes a valid gain_scale and frequency;
--frequency without a shake is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import load_benchmark

from mcpilco_core.config import load_robot_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_search_climbs_and_never_returns_worse_than_its_start():
    bench = load_benchmark("bench_balance_search")
    target = np.array([0.1, -0.05, 0.02, 0.0])
    scored = []

    def score(theta):
        scored.append(theta.copy())
        return -float(np.sum((theta - target) ** 2))

    seen = []
    best, best_score, history = bench.search(score, np.zeros(4), np.full(4, 0.02), 60, np.random.default_rng(0),
                                             report=lambda line: None,
                                             on_step=lambda b, s, h: seen.append((b.copy(), s, len(h))))
    assert len(history) == 61 and len(scored) == 61 and len(seen) == 61
    assert best_score == max(h["score"] for h in history) and best_score > history[0]["score"]
    assert np.sum((best - target) ** 2) < 0.5 * np.sum(target ** 2)
    assert all(h["kept"] == (h["score"] >= max(g["score"] for g in history[:i])) for i, h in enumerate(history)
               if i > 0)
    assert [s for _, s, _ in seen] == sorted(s for _, s, _ in seen)        # the best so far never falls


def test_a_tiny_search_on_the_design_robot_writes_settings_the_config_accepts(tmp_path, capsys):
    bench = load_benchmark("bench_balance_search")
    out = tmp_path / "search.json"
    design = ROOT / "config" / "design_robots" / "acrobot_exploration_identified.yaml"
    code = bench.main(["--robot-profile", str(design),
                       "--policy", str(ROOT / "policies" / "acrobot_hardware_proxy.npz"),
                       "--config", str(ROOT / "config" / "acrobot_dither.yaml"), "--frequency", "--seeds", "1000",
                       "--seconds", "4", "--iterations", "2", "--processes", "1", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert len(result["history"]) == 3 and result["seeds"] == [1000]
    scale, frequency = result["best"]["lqr.gain_scale"], result["best"]["dither.frequency"]
    assert len(scale) == 4 and all(s > 0 for s in scale) and 3.0 < frequency < 13.0
    bench_rc = load_benchmark("bench_robot_config")
    variant = bench_rc.variant_config(ROOT / "config" / "acrobot_dither.yaml", result["best"], tmp_path, 0)
    assert variant.lqr.gain_scale == tuple(scale) and variant.dither.frequency == frequency
    assert "no robot time" in capsys.readouterr().out


def test_searching_the_frequency_of_a_config_without_a_shake_is_refused(tmp_path):
    bench = load_benchmark("bench_balance_search")
    assert load_robot_config(ROOT / "config" / "acrobot.yaml").dither.amplitude == 0.0
    with pytest.raises(SystemExit):
        bench.main(["--robot-profile", "nominal", "--policy", str(ROOT / "policies" / "acrobot.npz"),
                    "--config", str(ROOT / "config" / "acrobot.yaml"), "--frequency", "--out", str(tmp_path / "x")])
