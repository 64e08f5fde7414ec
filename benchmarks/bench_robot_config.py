"""Robot-config settings (switching levels, damping, the catch plan...) for a policy, judged by the protocol simulated
on a run's own model: the learner's robot, no robot time.

Why: a setting chosen by the protocol on the simulated robot itself would be chosen on the robot (an hour of robot
time for 24 seeds × 60 s × a few settings); chosen on the learner's own robot (the model's plant: the prior with what
the trials identified) it costs nothing, and the report seeds stay unseen (docs/learner.md, "The switching, the catch
plan's judge, and a balance on the stuck shoulder").

    python benchmarks/bench_robot_config.py runs/R2 --policy policies/acrobot.npz --config config/acrobot.yaml \
        --set roa.enter_fraction=6 --set roa.enter_fraction=4,roa.exit_fraction=8 --set damping.enabled=false \
        --seeds 1000 1001 ... 1023 --processes 2
    python benchmarks/bench_robot_config.py --robot-profile config/design_robots/acrobot_exploration_identified.yaml \
        --policy policies/acrobot_hardware_proxy.npz --config config/acrobot_dither.yaml --set dither.frequency=7

Each ``--set`` is one variant of ``--config``: dotted keys of the robot config (as in its YAML), comma-separated,
values read as YAML. A variant is validated as the file would be (an unknown key or a bad value is an error naming
it). The first row is ``--config`` as it is. Prints a markdown table: the mean fraction of the time up per variant
over ``--seeds`` (each ``--seconds`` long) on the run's own robot (``learning.protocol.on_model``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import ConfigError, read_yaml, robot_config_from_mapping, unwrap_ros_parameters  # noqa: E402


def parse_variant(text: str) -> dict[str, object]:
    """'a.b=1,c=true' -> {'a.b': 1, 'c': True} (values parsed as YAML scalars)."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {text!r}: expected key=value pairs, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def with_overrides(params: dict, overrides: dict[str, object]) -> dict:
    """A deep copy of the parameter mapping with each dotted key set."""
    out = copy.deepcopy(params)
    for dotted, value in overrides.items():
        node = out
        *parents, last = dotted.split(".")
        for name in parents:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {dotted}: {name} is not a section")
        node[last] = value
    return out


def variant_config(base: Path, overrides: dict[str, object], scratch: Path, index: int):
    """The robot config of ``base`` with ``overrides``, validated; its source (and so its ROA cache) in ``scratch``
    so that the shipped file's cache is never touched; relative paths resolve beside ``base``."""
    params = unwrap_ros_parameters(read_yaml(base), base)
    return robot_config_from_mapping(with_overrides(params, overrides), scratch / f"variant_{index}.yaml", base.parent)


class OwnModel:
    """The judge's robot of a run: its newest model's plant and profile (``learning.protocol.on_model``)."""

    def __init__(self, run: str, policy: str) -> None:
        from mcpilco_core.learning.polish import load_source
        from mcpilco_core.learning.protocol import on_model

        self.source = load_source(run, policy)
        self.robot, self.profile = on_model(self.source.config, self.source.model)
        name = getattr(self.profile, "name", self.profile)
        self.description = f"{run}'s own robot ({self.source.model_from}; profile {name})"

    def setting(self, robot_config):
        """(training config, simulated robot config, profile) for one variant."""
        return (replace(self.source.config, robot=robot_config), replace(robot_config, plant=self.robot.plant),
                self.profile)


class DesignRobot:
    """A robot profile file (e.g. config/design_robots/...: identified from counted trials) with each variant's
    own plant."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.description = f"the robot profile {profile}"

    def setting(self, robot_config):
        return SimpleNamespace(robot=robot_config), robot_config, self.profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", help="run or session directory whose newest model is the judge's robot")
    parser.add_argument("--robot-profile", help="judge on this robot profile instead (with --config's plant), e.g. "
                                                "a design robot identified from counted trials")
    parser.add_argument("--policy", required=True, help="policy file run in every variant")
    parser.add_argument("--config", required=True, help="robot config the variants start from")
    parser.add_argument("--set", dest="variants", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help="one variant (repeat for more)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1000, 1024)),
                        help="protocol seeds of the judge (default 1000-1023; never the report seeds)")
    parser.add_argument("--seconds", type=float, default=60.0, help="s of protocol per seed")
    parser.add_argument("--processes", type=int, default=1, help="worker processes for the seeds")
    args = parser.parse_args(argv)

    if (args.run is None) == (args.robot_profile is None):
        parser.error("give a run directory or --robot-profile (one of them)")
    from mcpilco_core.learning.protocol import protocol_scores

    judge = OwnModel(args.run, args.policy) if args.run else DesignRobot(args.robot_profile)
    base = Path(args.config)
    rows = [("(as it is)", {})]
    try:
        rows += [(text, parse_variant(text)) for text in args.variants]
    except ValueError as exc:
        parser.error(str(exc))
    with tempfile.TemporaryDirectory(prefix="bench_robot_config_") as scratch:
        configs = []
        for index, (label, overrides) in enumerate(rows):       # every variant validated before any run
            try:
                configs.append(variant_config(base, overrides, Path(scratch), index))
            except (ConfigError, ValueError) as exc:
                print(f"error: {base} with --set {label!r}: {str(exc).split(': ', 1)[-1]}", file=sys.stderr)
                return 2
        print(f"{args.policy} with {base}, judged on {judge.description}, seeds {args.seeds[0]}..{args.seeds[-1]} "
              f"({len(args.seeds)}) x {args.seconds:g} s, no robot time\n")
        print("| variant | judged (mean fraction up) | std over seeds | wall (s) |")
        print("|---|---|---|---|")
        for (label, _), robot_config in zip(rows, configs):
            config, judged_on, profile = judge.setting(robot_config)
            start = time.perf_counter()
            scores = protocol_scores(config, args.policy, judged_on, args.seeds, args.seconds, profile,
                                     args.processes)
            print(f"| {label} | {np.mean(scores):.4f} | {np.std(scores):.4f} | "
                  f"{time.perf_counter() - start:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
