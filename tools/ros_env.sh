# Source me: ROS 2 settings that keep every node and test on this machine (DESIGN.md section 7).
# ROS_DOMAIN_ID is left to its users, in disjoint ranges: tests 1-99 (test/conftest.py), demo and session
# 100-199 (mcpilco_ros/demo.py), benchmarks 200-229.
export AMENT_PREFIX_PATH="${AMENT_PREFIX_PATH:-${VIRTUAL_ENV:-$(pwd)/.venv}}"
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
if [ "${ROS_DISTRO:-}" = humble ]; then  # Humble's rcl knows ROS_LOCALHOST_ONLY, not the range (Iron and newer)
  export ROS_LOCALHOST_ONLY="${ROS_LOCALHOST_ONLY:-1}"
fi
export ROS_LOG_DIR="${ROS_LOG_DIR:-$(mktemp -d -t mcpilco_roslog.XXXXXX)}"
export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
export MPLBACKEND="${MPLBACKEND:-Agg}"
