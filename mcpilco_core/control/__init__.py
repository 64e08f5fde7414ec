"""Controllers: LQR, its region of attraction, damping and the supervisor that composes them.

:func:`build_controller` (a validated config + an optional policy -> a ready supervisor) is what the evaluator,
the ROS controller node and the learner use; :func:`load_controller` does the same from file paths.
"""

from __future__ import annotations

from pathlib import Path

from ..config import BANK_SEPARATOR, ConfigError, RobotConfig, load_robot_config
from ..plant import DoublePendulum
from ..policy import SumOfGaussiansPolicy, check_period, load_policy
from .lqr import LqrDesign, configured_lqr, design_lqr
from .roa import RoaEstimate, region_of_attraction
from .supervisor import MODES, Supervisor

__all__ = ["LqrDesign", "MODES", "RoaEstimate", "Supervisor", "build_controller", "configured_lqr", "design_lqr",
           "load_bank", "load_controller", "lqr_plant", "region_of_attraction"]


def build_controller(config: RobotConfig, policy: SumOfGaussiansPolicy | None = None,
                     use_roa_cache: bool = True) -> Supervisor:
    """The supervisor for ``config``: LQR + ROA + damping, and the swing-up ``policy`` when given. The LQR and its
    ROA estimate are designed on ``lqr.plant_model`` when the config names one, else on the config's plant."""
    plant = lqr_plant(config)
    design = configured_lqr(plant, config)
    roa = region_of_attraction(config, plant, design, use_cache=use_roa_cache)
    if policy is not None and policy.robot != config.robot:
        raise ValueError(f"policy is for the {policy.robot}, the configuration for the {config.robot}")
    if isinstance(policy, SumOfGaussiansPolicy):
        check_period(policy, config.policy_period)  # PolicyError: it would run at another rate than it was made for
    return Supervisor(config, design, roa.rho, policy, load_bank(config, policy))


def lqr_plant(config: RobotConfig) -> DoublePendulum:
    """The plant the LQR and its ROA estimate are designed on: ``lqr.plant_model``'s, else the config's."""
    return DoublePendulum(config.lqr.plant or config.plant)


def load_bank(config: RobotConfig, policy: SumOfGaussiansPolicy | None = None) -> list[SumOfGaussiansPolicy]:
    """The opt-in selection's other candidates: each bank directory's ``*.npz`` files by name, directory after
    directory, each validated for this robot, its torque limit and its policy period, less any with the same
    parameters as ``policy`` or an earlier one ([] when the selection is off or names no bank). PolicyError names a
    bad file; ConfigError a bank directory without a policy."""
    if not config.selection.enabled or not config.selection.bank:
        return []
    files = []
    for directory in config.selection.bank.split(BANK_SEPARATOR):   # each directory's files by name, in turn
        found = sorted(Path(directory).glob("*.npz"))
        if not found:
            raise ConfigError(config.source, "selection.bank", f"no *.npz policy in {directory}")
        files.extend(found)
    seen = {policy.version()} if isinstance(policy, SumOfGaussiansPolicy) else set()
    bank = []
    for path in files:
        candidate = load_policy(path, robot=config.robot, torque_limit=config.torque_limit,
                                policy_period=config.policy_period)
        if candidate.version() not in seen:
            seen.add(candidate.version())
            bank.append(candidate)
    return bank


def load_controller(config_path: str | Path, policy_path: str | Path | None = None) -> Supervisor:
    """Load a robot configuration and (optionally) a policy file into a ready-to-step controller.

    Without a policy the controller is LQR + damping (zero torque outside the LQR's region of attraction).
    Raises ConfigError / PolicyError with the file and the reason on bad input.
    """
    config = load_robot_config(config_path)
    policy = None
    if policy_path is not None:
        policy = load_policy(policy_path, robot=config.robot, torque_limit=config.torque_limit)
    return build_controller(config, policy)
