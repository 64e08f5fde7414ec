"""Tune the balance's feedback for the protocol on a judge robot: a (1+1) evolution strategy over the log-factors of
``lqr.gain_scale`` (and, with ``--frequency``, the shake's ``dither.frequency``), each candidate judged by the protocol
simulated with the robot config and the policy -- on a run's own model or on a design robot identified from counted
trials, so no robot time (docs/learner.md, "Tuning the balance for the protocol on the design robot").

Why: the LQR's Riccati gains are designed for the linearised frictionless model, and the catch test from states near
the top (bench_balance.py) does not predict what the protocol's hand-overs need: a search on the protocol itself found
gains 0.4-2.8 % off the Riccati ones that catch more of them on the friction design robot.

    python benchmarks/bench_balance_search.py --robot-profile config/design_robots/acrobot_exploration_identified.yaml \
        --policy policies/acrobot_hardware_proxy.npz --config config/acrobot_dither.yaml --frequency \
        --seeds 1000 1001 ... 1011 --iterations 120 --out runs/search.json
    python benchmarks/bench_balance_search.py runs/R2 --policy policies/acrobot.npz --config config/acrobot.yaml \
        --seeds 1000 ... 1011 --iterations 100 --out runs/search_nominal.json

The judge must be a robot like yours in its sensors and motors too: a design robot identified at the state rate
(``mcpilco identify RUN --trials 0 --write``: friction, rotor inertia, delay, lag and noise). Tuned on the pendubot's
older design robot (the prior with the identified friction, ideal sensors), the pendubot's balance scored +0.2 there and
0.26 instead of 0.67 on the hardware proxy. And a small gain on the design robot is not evidence: on ``perturbed:0``
the pendubot's search gained +0.02 on that robot's design robot and lost 0.05 on the robot. Check on the robot itself.

Each step draws one candidate around the best so far (normal steps of ``--sigma`` on each log-factor, 0.3 Hz on the
frequency), keeps it when it scores at least as well, and widens the steps by 1.2 after a success or narrows them by
0.97 after a failure. The judge's seeds are the only ones it sees: validate the result on other seeds (``mcpilco
evaluate`` with a design robot profile, or bench_robot_config.py) before using it. Writes ``--out`` (JSON: the best
gain_scale, frequency and score, and every candidate) after each step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_robot_config import DesignRobot, OwnModel, variant_config  # noqa: E402

from mcpilco_core.config import load_robot_config  # noqa: E402

WIDEN, NARROW = 1.2, 0.97
FREQUENCY_STEP = 0.3   # Hz


def overrides(theta: np.ndarray, with_frequency: bool) -> dict[str, object]:
    """The robot-config settings of one candidate: gain factors exp(theta[:4]) and, if searched, the frequency."""
    out: dict[str, object] = {"lqr.gain_scale": [round(math.exp(t), 6) for t in theta[:4]]}
    if with_frequency:
        out["dither.frequency"] = round(float(theta[4]), 6)
    return out


def search(judge_score, start: np.ndarray, sigma: np.ndarray, iterations: int, rng: np.random.Generator,
           report=print, on_step=None) -> tuple[np.ndarray, float, list[dict]]:
    """(1+1)-ES maximising ``judge_score(theta)`` from ``start``; returns (best theta, its score, the history).
    ``on_step(best, best_score, history)`` is called after each judged candidate (the start included)."""
    best, best_score = start.copy(), judge_score(start)
    history = [{"theta": best.tolist(), "score": best_score, "kept": True}]
    report(f"start: {best_score:.4f}")
    if on_step is not None:
        on_step(best, best_score, history)
    for step in range(iterations):
        candidate = best + sigma * rng.normal(size=best.size)
        score = judge_score(candidate)
        kept = score >= best_score
        if kept:
            best, best_score, sigma = candidate, score, sigma * WIDEN
        else:
            sigma = sigma * NARROW
        history.append({"theta": candidate.tolist(), "score": score, "kept": kept})
        report(f"step {step + 1}/{iterations}: {score:.4f} (best {best_score:.4f}, "
               f"gain_scale {np.round(np.exp(best[:4]), 4).tolist()}"
               + (f", frequency {best[4]:.3f} Hz" if best.size > 4 else "") + ")")
        if on_step is not None:
            on_step(best, best_score, history)
    return best, best_score, history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", help="run or session directory whose newest model is the judge's robot")
    parser.add_argument("--robot-profile", help="judge on this robot profile instead (e.g. a design robot)")
    parser.add_argument("--policy", required=True, help="policy file run in every candidate")
    parser.add_argument("--config", required=True, help="robot config the candidates start from")
    parser.add_argument("--frequency", action="store_true", help="search the shake's frequency too")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1000, 1012)),
                        help="protocol seeds of the judge (default 1000-1011; never the report seeds)")
    parser.add_argument("--seconds", type=float, default=60.0, help="s of protocol per seed")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--sigma", type=float, default=0.02, help="first step on each gain's log-factor")
    parser.add_argument("--seed", type=int, default=1, help="seed of the search's own draws")
    parser.add_argument("--processes", type=int, default=2, help="worker processes for the judge's seeds")
    parser.add_argument("--out", required=True, help="JSON file written after each step")
    args = parser.parse_args(argv)
    if (args.run is None) == (args.robot_profile is None):
        parser.error("give a run directory or --robot-profile (one of them)")
    from mcpilco_core.learning.protocol import protocol_scores

    judge = OwnModel(args.run, args.policy) if args.run else DesignRobot(args.robot_profile)
    base = Path(args.config)
    config = load_robot_config(base)
    if args.frequency and config.dither.amplitude <= 0.0:
        parser.error(f"--frequency: {base} has no balance dither (dither.amplitude 0)")
    start = np.array([math.log(s) for s in config.lqr.gain_scale]
                     + ([config.dither.frequency] if args.frequency else []))
    sigma = np.array([args.sigma] * 4 + ([FREQUENCY_STEP] if args.frequency else []))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{args.policy} with {base}, judged on {judge.description}, seeds {args.seeds[0]}..{args.seeds[-1]} "
          f"({len(args.seeds)}) x {args.seconds:g} s, no robot time", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_balance_search_") as scratch:
        count = [0]

        def judge_score(theta: np.ndarray) -> float:
            count[0] += 1
            robot_config = variant_config(base, overrides(theta, args.frequency), Path(scratch), count[0])
            run_config, judged_on, profile = judge.setting(robot_config)
            return float(np.mean(protocol_scores(run_config, args.policy, judged_on, args.seeds, args.seconds,
                                                 profile, args.processes)))

        started = time.perf_counter()

        def report(line: str) -> None:
            print(f"{line} ({time.perf_counter() - started:.0f} s)", flush=True)

        def write(best: np.ndarray, best_score: float, history: list[dict]) -> None:
            out.write_text(json.dumps({"best": overrides(best, args.frequency), "score": best_score,
                                       "seeds": args.seeds, "history": history}, indent=1))

        best, best_score, _ = search(judge_score, start, sigma, args.iterations, np.random.default_rng(args.seed),
                                     report, write)
    print(f"best: {json.dumps(overrides(best, args.frequency))}, judged {best_score:.4f}; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
