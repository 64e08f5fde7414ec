"""benchmarks/bench_robot_config.py: a variant is the robot config with dotted keys set, validated as the file
would be, and it never writes beside the shipped file (its ROA cache goes to the scratch folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _bench_helpers import load_benchmark

from mcpilco_core.config import ConfigError, load_robot_config

ROOT = Path(__file__).resolve().parents[1]




def test_a_variant_sets_its_keys_and_keeps_the_rest(tmp_path):
    bench = load_benchmark("bench_robot_config")
    overrides = bench.parse_variant("roa.enter_fraction=6, damping.enabled=false,catch.horizon=1.2")
    assert overrides == {"roa.enter_fraction": 6, "damping.enabled": False, "catch.horizon": 1.2}
    base = ROOT / "config" / "acrobot.yaml"
    variant = bench.variant_config(base, overrides, tmp_path, 0)
    shipped = load_robot_config(base)
    assert variant.roa.enter_fraction == 6.0 and variant.roa.exit_fraction == shipped.roa.exit_fraction
    assert variant.damping.enabled is False and variant.catch.horizon == 1.2
    assert variant.plant == shipped.plant and variant.lqr == shipped.lqr
    assert Path(variant.source).parent == tmp_path


@pytest.mark.parametrize("text, field", [("roa.entr=2", "roa.entr"), ("roa.enter_fraction=20", "roa.exit_fraction"),
                                         ("damping.gain=-1", "damping.gain")])
def test_a_bad_variant_is_refused_by_name(tmp_path, text, field):
    bench = load_benchmark("bench_robot_config")
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        bench.variant_config(ROOT / "config" / "acrobot.yaml", bench.parse_variant(text), tmp_path, 0)


def test_a_variant_without_a_value_is_refused():
    with pytest.raises(ValueError, match="key=value"):
        load_benchmark("bench_robot_config").parse_variant("damping")
