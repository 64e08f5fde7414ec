"""The main demo: the 60 s evaluation protocol, run through the ROS nodes on the simulated robot.

``mcpilco demo`` (or ``python -m mcpilco_ros.demo``) starts ``sim_driver_node`` and ``controller_node`` as
subprocesses with the same ``--ros-args --params-file config/<robot>.yaml`` the launch file uses, plus
``config/demo.yaml`` (armed at start, lockstep clock, protocol on, 60 s). The simulated robot writes the
trajectory; this module prints the score and writes the plot. ``--compare`` also runs ``mcpilco evaluate``'s
computation in-process for the same seed and prints the difference (the ROS path must not change behaviour).

This module never imports rclpy (the nodes run in their own processes), so ``mcpilco_ros.cli`` may
register it freely. Discovery stays on this machine (``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``, on Humble
``ROS_LOCALHOST_ONLY=1``, unless set) and the nodes get a private ``ROS_DOMAIN_ID`` unless one is set, so a demo
never talks to a robot.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path

import numpy as np

ROBOTS = ("pendubot", "acrobot")


def best_shipped_policy(robot: str) -> Path | None:
    """The shipped policy for ``robot`` (``policies/<robot>.npz``), or None (LQR + damping)."""
    from mcpilco_core.paths import shipped_policy

    return shipped_policy(robot)


def node_command(module: str, params_files: list[Path]) -> list[str]:
    """``python -m mcpilco_ros.<module> --ros-args --params-file A --params-file B ...`` (later files win)."""
    cmd = [sys.executable, "-m", f"mcpilco_ros.{module}", "--ros-args"]
    for path in params_files:
        cmd += ["--params-file", str(path)]
    return cmd


def write_overrides(path: Path, sections: dict[str, dict]) -> Path:
    """A params file with per-node sections: ``-p`` cannot override a node-specific section's value,
    a later ``--params-file`` can."""
    import yaml

    path.write_text(yaml.safe_dump({node: {"ros__parameters": values} for node, values in sections.items()}),
                    encoding="utf-8")
    return path


def keep_discovery_local(env: MutableMapping[str, str], domain: int) -> None:
    """Impose (not default) localhost-only discovery and ``domain`` on ``env``: a domain, range or static peers
    exported for a robot must never put the tests' or a benchmark's nodes into that robot's graph. ``OFF`` (no
    discovery at all) is kept; Humble's rcl knows ``ROS_LOCALHOST_ONLY``, not the range (Iron and newer)."""
    if env.get("ROS_AUTOMATIC_DISCOVERY_RANGE") != "OFF":
        env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    if env.get("ROS_DISTRO") == "humble":
        env["ROS_LOCALHOST_ONLY"] = "1"
    env.pop("ROS_STATIC_PEERS", None)
    env["ROS_DOMAIN_ID"] = str(domain)


def ros_environment(log_dir: Path | None = None) -> dict[str, str]:
    """The nodes' environment: localhost discovery and a private domain unless the caller chose one.

    The nodes' ROS logs go to the caller's ``ROS_LOG_DIR`` if it set one, else to ``log_dir`` (created): kept with the
    run they belong to rather than left behind in a new temporary folder on every run.
    """
    env = dict(os.environ)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if env.get("ROS_DISTRO") == "humble":   # Humble's rcl knows ROS_LOCALHOST_ONLY, not the range (Iron and newer)
        env.setdefault("ROS_LOCALHOST_ONLY", "1")
    env.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))
    if "ROS_LOG_DIR" not in env:
        if log_dir is None:
            env["ROS_LOG_DIR"] = tempfile.mkdtemp(prefix="mcpilco_demo_log_")
        else:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            env["ROS_LOG_DIR"] = str(Path(log_dir).resolve())
    env.setdefault("AMENT_PREFIX_PATH", sys.prefix)
    env.setdefault("MPLBACKEND", "Agg")
    return env


def run_demo(robot: str = "pendubot", seed: int = 0, policy: Path | None = None, config: Path | None = None,
             out_dir: Path = Path("runs/demo"), timeout: float = 900.0, compare: bool = False,
             quiet: bool = False, duration: float = 60.0) -> dict:
    """Run the protocol over ROS; returns {'score', 'plot', 'trajectory', 'wall_s', ('evaluate_score')}.

    ``duration`` (s) shortens the protocol for smoke tests; the score is always uptime / duration.
    """
    from mcpilco_core.config import load_robot_config
    from mcpilco_core.paths import config_dir

    config_path = Path(config) if config else config_dir() / f"{robot}.yaml"
    robot_config = load_robot_config(config_path)  # fail fast with the file and field named
    if robot_config.robot != robot:
        raise ValueError(f"{config_path}: robot is {robot_config.robot!r}, not {robot!r}")
    policy = Path(policy) if policy else best_shipped_policy(robot)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = (out_dir / f"{robot}_seed{seed}.npz").resolve()
    record.unlink(missing_ok=True)
    params = [config_path, config_dir() / "demo.yaml", write_overrides(out_dir / f"{robot}_seed{seed}.params.yaml", {
        "controller_node": {"policy": str(policy.resolve()) if policy else ""},
        "sim_driver_node": {"protocol": {"seed": int(seed)}, "record_file": str(record),
                            "duration": float(duration)}})]
    env = ros_environment(out_dir / "ros_log")
    say = (lambda *a: None) if quiet else print
    say(f"demo: {robot}, seed {seed}, policy {policy or 'none (LQR + damping)'}, config {config_path}")
    log = None if not quiet else subprocess.DEVNULL
    start = time.perf_counter()
    controller = subprocess.Popen(node_command("controller_node", params), env=env,
                                  stdout=log, stderr=log)
    try:
        sim = subprocess.Popen(node_command("sim_driver_node", params),
                               env=env, stdout=log, stderr=log)
        try:
            code = sim.wait(timeout=timeout)
        finally:
            stop_process(sim)
    finally:
        stop_process(controller)
    wall = time.perf_counter() - start
    if code != 0 or not record.is_file():
        raise RuntimeError(f"the simulated robot ended with code {code} and no trajectory at {record}")
    result = _report(robot_config, record, seed, policy, out_dir, wall, say)
    if compare:
        result["evaluate_score"] = _evaluate(robot_config, policy, seed, duration)
        say(f"mcpilco evaluate, same seed: score {result['evaluate_score']:.4f} "
            f"(difference {abs(result['score'] - result['evaluate_score']):.4f})")
    return result


def stop_process(proc: subprocess.Popen) -> None:
    """SIGINT (clean node shutdown), then SIGKILL if it does not leave."""
    if proc.poll() is None:
        proc.send_signal(2)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _report(robot_config, record: Path, seed: int, policy: Path | None, out_dir: Path, wall: float, say) -> dict:
    from mcpilco_core.plant import DoublePendulum
    from mcpilco_core.plotting import plot_evaluation
    from mcpilco_core.simulation import Trajectory

    data = np.load(record)
    traj = Trajectory(t=data["t"], x=data["x"], u=data["u"], u_cmd=data["u_cmd"], mode=data["mode"])
    score = float(data["score"])
    name = policy.name if policy else "lqr"
    plot = out_dir / f"{robot_config.robot}_seed{seed}.png"
    plot_evaluation(traj, DoublePendulum(robot_config.plant), plot, windows=data["windows"].tolist(),
                    title=f"{robot_config.robot} / {name} / seed {seed} over ROS: score {score:.3f}")
    timeouts = int(data["lockstep_timeouts"])
    say(f"score {score:.4f} (fraction of {float(data['t'][-1]):g} s above 0.45 m) in {wall:.1f} s wall time"
        f"{f'; {timeouts} steps without an answer' if timeouts else ''}")
    say(f"wrote {plot} and {record}")
    return {"score": score, "plot": plot, "trajectory": record, "wall_s": wall, "lockstep_timeouts": timeouts}


def _evaluate(robot_config, policy: Path | None, seed: int, duration: float) -> float:
    from mcpilco_core.control import build_controller
    from mcpilco_core.evaluation import evaluate_seed
    from mcpilco_core.policy import load_policy

    loaded = (load_policy(policy, robot=robot_config.robot, torque_limit=robot_config.torque_limit)
              if policy else None)
    return evaluate_seed(build_controller(robot_config, loaded), robot_config, seed, duration,
                         keep_trajectory=False).score


# --------------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--robot", choices=ROBOTS, default="pendubot")
    parser.add_argument("--seed", type=int, default=0, help="disturbance schedule seed (as in mcpilco evaluate)")
    parser.add_argument("--policy", type=Path, help="policy file (default: the best shipped one, else LQR only)")
    parser.add_argument("--config", type=Path, help="robot config (default: the bundled config/<robot>.yaml)")
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="folder for the plot and trajectory")
    parser.add_argument("--compare", action="store_true", help="also run mcpilco evaluate's computation")
    parser.add_argument("--timeout", type=float, default=900.0, help="s of wall time before giving up")


def _run(args: argparse.Namespace) -> int:
    run_demo(args.robot, args.seed, args.policy, args.config, args.out, args.timeout, args.compare)
    return 0


def register(subparsers) -> None:
    """``mcpilco demo``: for mcpilco_ros.cli's COMMAND_MODULES (imports nothing of ROS here)."""
    p = subparsers.add_parser("demo", help="run the 60 s protocol through the ROS nodes (simulated robot)",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcpilco_ros.demo", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
