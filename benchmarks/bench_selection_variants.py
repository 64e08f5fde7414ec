"""Two changes to how the opt-in policy selection judges its candidates, on the proxy acrobot's design robot
(issue 15). Prototypes: neither is in the package, neither beat the shipped selection (docs/learner.md, "Truer,
further-sighted or batched simulations in the selection").

Why: the selection (control/selection.py) finds a catchable arrival in four disturbances of five on the proxy, but
late. If its simulations mispredicted which candidate's arrival the shaken LQR holds, a truer simulation or a value
that credits the catch itself would choose better. Each variant changes one thing:

* ``delay:K``: each candidate's simulation feeds the shadow supervisor the model state K simulation steps old, as the
  robot's sensors do (the design robot's delay is 5 ms; at the selection's 4 ms step K = 1, at ``--step 0.002``
  K = 2). The motor's lag is left out: 0.9 per 2 ms is a time constant under 1 ms.
* ``end:W``: a candidate whose simulation ends with the LQR in charge (caught) gets W s added to its time above the
  line.
* ``plain``: the shipped selection (the harness check: it must give ``mcpilco evaluate``'s number).

``delay:K`` is in the package since 2026-12-02 as ``selection.delay`` (s; K = int(delay / step)): alone it lost, with
the opt-in state observer in front of the supervisor it gained (docs/learner.md, "The robot's delay in the
selection's simulations").

Run on the design robot (``config/design_robots/acrobot_exploration_identified.yaml``) with
``config/acrobot_dither_select.yaml`` and ``policies/acrobot_hardware_proxy.npz`` (``--config``, ``--robot-profile``
and ``--policy`` choose others); no robot time:

    python benchmarks/bench_selection_variants.py plain delay:1 end:0.5 end:2 --seeds 200 201 ... 223
    python benchmarks/bench_selection_variants.py delay:2 --step 0.002 --seeds 200 201 ... 223
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import RobotConfig, load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.control.selection import PolicySelection  # noqa: E402
from mcpilco_core.evaluation import DURATION, evaluate_seed  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "acrobot_dither_select.yaml"
POLICY = ROOT / "policies" / "acrobot_hardware_proxy.npz"
DESIGN_ROBOT = ROOT / "config" / "design_robots" / "acrobot_exploration_identified.yaml"


class VariantSelection(PolicySelection):
    """The selection with one variant (module docstring): ``end_bonus`` s for a simulation that ends with the LQR in
    charge. The ``delay`` variant is the package's own ``delay_steps`` (``selection.delay``), set on the instance."""

    end_bonus = 0.0

    def _value(self, up: int) -> float:
        return up * self.dt + (self.end_bonus if self.shadow.mode == "lqr" else 0.0)


def parse_variant(text: str) -> tuple[int, float]:
    """``plain`` | ``delay:K`` | ``end:W`` -> (delay steps, end bonus in s)."""
    kind, _, value = text.partition(":")
    if kind == "plain" and not value:
        return 0, 0.0
    if kind == "delay" and value.isdigit():
        return int(value), 0.0
    if kind == "end" and value:
        return 0, float(value)
    raise argparse.ArgumentTypeError(f"expected plain, delay:K or end:W, got {text!r}")


def controller(config: RobotConfig, variant: tuple[int, float], policy_path: str = str(POLICY)):
    """The supervisor of ``config`` with the policy file ``policy_path``, its selection switched to ``variant``."""
    policy = load_policy(policy_path, robot=config.robot, torque_limit=config.torque_limit)
    supervisor = build_controller(config, policy)
    selection = supervisor.selection
    selection.__class__ = VariantSelection
    delay, selection.end_bonus = variant
    if delay:
        selection.delay_steps = delay
    return supervisor


def score(args: tuple) -> float:
    config_path, step, variant, seed, profile, duration, policy_path = args
    config = load_robot_config(config_path)
    if step:
        config = replace(config, selection=replace(config.selection, step=step))
    result = evaluate_seed(controller(config, variant, policy_path), config, seed, duration=duration,
                           keep_trajectory=False, profile=profile)
    return result.score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", help="plain | delay:K | end:W")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(200, 224)))
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--robot-profile", default=str(DESIGN_ROBOT))
    parser.add_argument("--policy", default=str(POLICY), help="the loaded policy file (candidate 0)")
    parser.add_argument("--step", type=float, default=0.0, help="s, the simulations' RK4 step (0: the config's)")
    parser.add_argument("--duration", type=float, default=DURATION, help="s of protocol per seed")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    variants = [(text, parse_variant(text)) for text in args.variants]
    half = len(args.seeds) // 2
    with Pool(args.jobs) as pool:
        for text, variant in variants:
            scores = pool.map(score, [(args.config, args.step, variant, s, args.robot_profile, args.duration,
                                       args.policy)
                                      for s in args.seeds])
            first, second = np.mean(scores[:half] or scores), np.mean(scores[half:])
            print(f"| {text} | {first:.3f} | {second:.3f} | {np.mean(scores):.4f} |", flush=True)


if __name__ == "__main__":
    main()
