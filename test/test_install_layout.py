"""What `colcon build` installs is enough to run every shipped robot config: each file of setup.py's ``data_files`` is
laid out under a temporary ``share/mcpilco_ros`` as colcon would, and each robot config there loads and finds what it
names (plant models, design-robot plants, selection banks). Why: a config that names a directory setup.py does not
install works from the checkout and fails on the robot computer, where ``ros2 launch`` reads the installed copy."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import setuptools
import yaml

from mcpilco_core.config import ConfigError, load_robot_config
from mcpilco_core.control import load_bank

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "mcpilco_ros"


def data_files() -> list[tuple[str, list[str]]]:
    """setup.py's ``data_files``, read by running it with ``setuptools.setup`` replaced (nothing is built)."""
    captured: dict = {}
    real_setup, cwd = setuptools.setup, os.getcwd()
    setuptools.setup = lambda **kwargs: captured.update(kwargs)
    try:
        os.chdir(REPO)                              # its globs and requirements files are relative to the checkout
        source = (REPO / "setup.py").read_text(encoding="utf-8")
        exec(compile(source, str(REPO / "setup.py"), "exec"), {"__name__": "__main__"})   # noqa: S102
    finally:
        setuptools.setup = real_setup
        os.chdir(cwd)
    return captured["data_files"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The install prefix with every data file copied where colcon puts it."""
    prefix = tmp_path_factory.mktemp("install")
    for target, files in data_files():
        for name in files:
            destination = prefix / target / Path(name).name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / name, destination)
    return prefix / "share" / PACKAGE


def robot_configs(share: Path) -> list[Path]:
    """The installed ROS parameter files that hold a robot config (``/**: ros__parameters: robot: ...``)."""
    found = []
    for path in sorted((share / "config").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "robot" in (data.get("/**") or {}).get("ros__parameters", {}):
            found.append(path)
    return found


def test_every_installed_robot_config_loads_and_finds_its_bank(installed):
    configs = robot_configs(installed)
    assert len(configs) >= 10 and installed.joinpath("config", "acrobot_dither_select.yaml") in configs
    banks = 0
    for path in configs:
        config = load_robot_config(path)            # plant models, design-robot plants, bank directories: all found
        if config.selection.bank:
            bank = load_bank(config)
            assert bank, path.name
            assert all(Path(part).is_relative_to(installed) for part in config.selection.bank.split(":")), path.name
            banks += 1
    assert banks >= 2                               # acrobot_select.yaml, acrobot_dither_select.yaml


def test_a_bank_directory_setup_py_forgot_is_found_missing(installed, tmp_path):
    """The check above can fail: the proxy config's second bank directory removed from the installed tree."""
    share = tmp_path / PACKAGE
    shutil.copytree(installed, share)
    shutil.rmtree(share / "policies" / "acrobot_bank")
    with pytest.raises(ConfigError, match="selection.bank.*acrobot_bank"):
        load_robot_config(share / "config" / "acrobot_dither_select.yaml")


def test_every_installed_roa_cache_belongs_to_a_robot_config(installed):
    """A ``<name>.roa.json`` is the cached estimate of ``<name>.yaml``'s region of attraction: one without its robot
    config is left over from a scratch file and would be installed on the robot computer for nothing."""
    configs = {path.stem for path in robot_configs(installed)}
    caches = sorted(installed.joinpath("config").glob("*.roa.json"))
    assert caches
    assert [path.name for path in caches if path.name.removesuffix(".roa.json") not in configs] == []
