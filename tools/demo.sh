#!/usr/bin/env bash
# Set up everything and run the main job on the simulated robot: the pendubot with the best shipped
# controller, through the ROS 2 nodes (simulated robot + controller, as the launch file starts them),
# for the 60 s global-policy protocol (ICRA 2025 AI Olympics, seed 0). Prints the score, checks it
# against the non-ROS evaluator, and writes a plot and the trajectory to out/demo/.
# Extra arguments go to `mcpilco demo` (e.g. --seed 3, --robot acrobot, --policy FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# shellcheck disable=SC1091
source .venv/bin/activate
# shellcheck disable=SC1091
source tools/ros_env.sh
mcpilco demo --robot pendubot --seed 0 --compare --out out/demo "$@"
