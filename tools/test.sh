#!/usr/bin/env bash
# Set up everything and run all tests (lint included). Extra arguments go to pytest.
# Runs inside a private network namespace (unshare -n, loopback only) where the kernel allows it, so no
# test can send traffic beyond this machine; ROS discovery is limited to localhost either way.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# shellcheck disable=SC1091
source .venv/bin/activate
source tools/ros_env.sh
PYTEST=(python -m pytest -q -p no:cacheprovider "$@")
if unshare -n true 2>/dev/null && command -v ip >/dev/null; then
  echo "running the tests in a private network namespace"
  exec unshare -n bash -c 'ip link set lo up && exec "$@"' bash "${PYTEST[@]}"
fi
echo "unshare -n (or ip, to bring up its loopback) is not available here: running the tests with localhost-only ROS discovery"
exec "${PYTEST[@]}"
