"""Where the package's data lives: the source tree, or ``share/mcpilco_ros`` once installed."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = "mcpilco_ros"
_SOURCE_ROOT = Path(__file__).resolve().parent.parent


def share_dir() -> Path:
    """The package's share directory: the ament index (ROS install), sys.prefix, or the source tree.

    The source tree wins when this module runs from a checkout (editable install), so edits to
    ``config/`` take effect without reinstalling.
    """
    if (_SOURCE_ROOT / "config").is_dir() and (_SOURCE_ROOT / "package.xml").is_file():
        return _SOURCE_ROOT
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory(PACKAGE))
    except Exception:  # ament_index not installed, or the package is not in the index
        pass
    installed = Path(sys.prefix) / "share" / PACKAGE
    if installed.is_dir():
        return installed
    raise FileNotFoundError(f"cannot find the {PACKAGE} share directory (config/, launch/, policies/)")


def config_dir() -> Path:
    return share_dir() / "config"


def policies_dir() -> Path:
    return share_dir() / "policies"


def shipped_policy(robot: str) -> Path | None:
    """The policy shipped for ``robot`` (``policies/<robot>.npz``: the best one we trained), or None."""
    try:
        path = policies_dir() / f"{robot}.npz"
    except FileNotFoundError:
        return None
    return path if path.is_file() else None
