#!/usr/bin/env bash
# Create/refresh the project's virtual environment (.venv) with the pinned dependencies and the package
# installed in editable mode. Idempotent and fast when nothing changed (a hash of the requirement files).
#
# Without a ROS 2 install (no ROS_DISTRO), the ROS 2 Kilted client wheels from PyPI are installed too
# (x86_64 only). With a sourced ROS 2 install, the venv sees the system's rclpy instead.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${MCPILCO_VENV:-.venv}
REQUIREMENTS=(-r requirements.txt)
VENV_ARGS=()
if [ -n "${ROS_DISTRO:-}" ]; then
  VENV_ARGS+=(--system-site-packages)   # use the sourced ROS 2 install's rclpy and messages
  # apt's ROS 2 (Humble, Jazzy, Kilted) is built against numpy 1.x: keep numpy 1 in front of it (the whole suite
  # passes with numpy 1.26.4 and scipy 1.15.3, README "Installing on a robot computer")
  system_ros_requirements=$(mktemp -t mcpilco_requirements.XXXXXX)
  trap 'rm -f "$system_ros_requirements"' EXIT
  sed -e 's/^numpy==.*/numpy==1.26.4/' -e 's/^scipy==.*/scipy==1.15.3/' requirements.txt | awk '!seen[$0]++' \
    > "$system_ros_requirements"
  REQUIREMENTS=(-r "$system_ros_requirements")
elif [ "$(uname -m)" = "x86_64" ]; then
  REQUIREMENTS+=(-r requirements-ros.txt)
else
  echo "warning: no ROS 2 install and no ROS wheels for $(uname -m): ROS nodes and their tests are skipped" >&2
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV"
  "$PYTHON" -m venv "${VENV_ARGS[@]}" "$VENV"
fi
stamp="$VENV/.mcpilco-setup"
want=$(cat requirements.txt requirements-ros.txt setup.py | sha256sum | cut -d' ' -f1)-${ROS_DISTRO:-wheels}
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing dependencies into $VENV (first time: about a minute)"
  # pip's own status decides (pipefail); only grep's "nothing left to print" is not a failure
  pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  }
  pip_install "${REQUIREMENTS[@]}" || { echo "error: installing the dependencies failed (above)" >&2; exit 1; }
  pip_install --no-deps -e . || { echo "error: installing the package failed (above)" >&2; exit 1; }
  "$VENV/bin/python" -c "import torch, numpy, scipy, yaml, moteus, rosbags, mcpilco_core" \
    || { echo "error: dependency installation failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
