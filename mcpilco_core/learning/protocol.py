"""The evaluation protocol scored in simulation for the learner's choices: on the learner's own robot
(:func:`on_model`; no robot time) or, for a counted robot check, on the run's robot. ``mcpilco select``'s ranking
and check and the optimiser's snapshot judge (``Learner.protocol_judge``) all score through
:func:`protocol_scores`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..policy import load_policy
from .model import DynamicsModel


def on_model(config, model: DynamicsModel, profile: str = ""):
    """(robot config, robot profile) of the learner's own robot: the run's robot config with the model's plant.
    With ``gp.identify_robot`` (``model.robot``) that is the robot identified at the state rate -- its friction,
    rotor inertia, sensor delay, motor lag and noise (identified_robot.py); else the GP prior's plant (friction
    and Ir from ``gp.identify``, or the user's prior) with ideal sensors and motors. ``profile`` (a robot profile's
    name or file, ``mcpilco polish --judge-profile``): that robot instead, with the run's robot config as the
    controller."""
    if profile:
        return config.robot, profile
    if model.robot is not None:
        return replace(config.robot, plant=model.robot.plant), model.robot.profile()
    return replace(config.robot, plant=model.config.plant), "nominal"


def protocol_scores(config, policy, robot, seeds, seconds: float, profile: str, processes: int = 1) -> list[float]:
    """Fraction of the time up, per disturbance schedule of ``seeds``, of the run's controller with ``policy`` (a
    policy file, or the runtime policy itself), over ``seconds`` (s) of the protocol on the simulated robot
    ``profile`` of the robot config ``robot`` (the run's robot and profile for the robot; :func:`on_model`'s for the
    model). The ranking, the check and the optimiser's snapshot judge (``Learner.protocol_judge``) all score through
    here. ``processes`` > 1: the seeds run in that many worker processes (the same numbers,
    :func:`evaluation.fractions_up`)."""
    from ..control import build_controller
    from ..evaluation import fractions_up

    if isinstance(policy, (str, Path)):
        policy = load_policy(policy, robot=config.robot.robot, torque_limit=config.robot.torque_limit)
    controller = build_controller(config.robot, policy)
    return fractions_up(controller, robot, seeds, seconds, profile, processes)


def protocol_judge(config, model: DynamicsModel, seeds, seconds: float, processes: int = 1, profile: str = ""):
    """A judge of torch policies (a callable policy -> score): the mean fraction of the time up over ``seeds`` x
    ``seconds`` (s) of the protocol simulated on :func:`on_model`'s robot, with the controller the policy will run in
    (its LQR and switching). A simulation of the model: no robot time. The optimiser's snapshot judge
    (``Learner.protocol_judge``) and ``mcpilco polish`` use it; ``processes`` (``optimizer.judge_processes``) > 1 runs
    its seeds in parallel, with the same scores. ``profile`` (a robot profile's name or file): run there instead,
    with the run's robot config as the controller (``mcpilco polish --judge-profile``)."""
    import numpy as np

    robots = [on_model(config, model, name) for name in judge_profiles(profile)]

    def judge(policy) -> float:
        runtime = policy.to_numpy(config.robot.robot, config.robot.policy_period)
        return float(np.mean([protocol_scores(config, runtime, robot, seeds, seconds, name, processes)
                              for robot, name in robots]))

    return judge


def judge_profiles(spec: str) -> list[str]:
    """The robot profiles a judge runs on: ``spec`` names one, or several separated by commas (``mcpilco polish
    --judge-profile A B``), '' the learner's own robot ([''] then). Several: the judge's score is the mean over
    them, each on the same seeds. Why: a polish judged on one design robot follows that robot closely enough to
    overfit it (acrobot, 2026-11-30: +0.04 on the 3 s design robot, +0.01 on one identified from 22 s, +0.00 on the
    proxy); robots identified from different trials stand for what the identification does not know."""
    names = [name.strip() for name in str(spec).split(",")]
    if len(names) > 1 and not all(names):
        raise ValueError(f"judge_profile: {spec!r} has an empty name between its commas")
    return names
