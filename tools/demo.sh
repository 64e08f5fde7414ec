#!/usr/bin/env bash
# Set up everything and run the main job on the simulated robot: the pendubot with the best shipped
# controller under the 60 s global-policy protocol (ICRA 2025 AI Olympics), seeds 0-9.
# Prints each seed's score and writes out/demo/pendubot.json and out/demo/pendubot.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# shellcheck disable=SC1091
source .venv/bin/activate
CONTROLLER=lqr
if [ -f policies/pendubot.npz ]; then CONTROLLER=policies/pendubot.npz; fi
mcpilco evaluate --robot pendubot --controller "$CONTROLLER" --seeds 0 1 2 3 4 5 6 7 8 9 --jobs 2 \
  --json out/demo/pendubot.json --plot out/demo/pendubot.png "$@"
