"""ament_python package mcpilco_ros: MC-PILCO global swing-up control of the RealAIGym double pendulum."""

from glob import glob

from setuptools import setup

PACKAGE = "mcpilco_ros"


def requirements(path: str) -> list[str]:
    """The pinned requirements (one place: requirements.txt), without comments."""
    with open(path, encoding="utf-8") as handle:
        lines = [line.split("#")[0].strip() for line in handle]
    return [line for line in lines if line]


RUNTIME = [r for r in requirements("requirements.txt") if not r.startswith(("pytest", "ruff"))]
TEST = [r for r in requirements("requirements.txt") if r.startswith(("pytest", "ruff"))]

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=["mcpilco_core", "mcpilco_core.control", "mcpilco_core.hardware", "mcpilco_core.recording",
              "mcpilco_core.learning", "mcpilco_ros"],
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml") + glob("config/*.json")),
        (f"share/{PACKAGE}/config/experiments", glob("config/experiments/*.yaml")),
        (f"share/{PACKAGE}/config/design_robots", glob("config/design_robots/*.yaml")),
        (f"share/{PACKAGE}/policies", glob("policies/*.npz")),
        (f"share/{PACKAGE}/policies/acrobot_bank", glob("policies/acrobot_bank/*.npz")),   # config/acrobot_select.yaml
        (f"share/{PACKAGE}/policies/acrobot_bank_mirrored",                              # and acrobot_select.yaml
         glob("policies/acrobot_bank_mirrored/*.npz")),
        (f"share/{PACKAGE}/policies/acrobot_hardware_proxy_bank",                        # acrobot_dither_select.yaml
         glob("policies/acrobot_hardware_proxy_bank/*.npz")),
    ],
    install_requires=RUNTIME,
    extras_require={"test": TEST},
    zip_safe=True,
    maintainer="mcpilco_ros developers",
    maintainer_email="mcpilco-ros@example.invalid",
    description="MC-PILCO global swing-up-and-balance control for the RealAIGym pendubot and acrobot",
    license="Apache-2.0",
    python_requires=">=3.10",
    entry_points={
        "console_scripts": [
            "mcpilco = mcpilco_ros.cli:main",
            "controller_node = mcpilco_ros.controller_node:main",
            "sim_driver_node = mcpilco_ros.sim_driver_node:main",
            "moteus_driver_node = mcpilco_ros.moteus_driver_node:main",
            "trainer_node = mcpilco_ros.trainer_node:main",
        ],
    },
)
