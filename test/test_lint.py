"""Linters run as tests, and the ROS-free core stays ROS-free."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROS_MODULES = {"rclpy", "launch", "launch_ros", "sensor_msgs", "std_msgs", "std_srvs", "diagnostic_msgs"}


def test_ruff():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed")
    result = subprocess.run([ruff, "check", "--no-cache", str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_never_imports_ros():
    offenders = []
    for path in (REPO / "mcpilco_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] in ROS_MODULES]
    assert not offenders, offenders


def test_every_pin_installs_on_the_oldest_supported_python():
    """A pinned release whose Requires-Python excludes setup.py's oldest Python (3.10: Humble's) carries a
    ``python_version`` marker with a pin for the older Pythons (numpy 2.3 and scipy 1.16 need 3.11)."""
    from importlib.metadata import PackageNotFoundError, metadata

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    oldest = re.search(r'python_requires=">=(\d+\.\d+)"', (REPO / "setup.py").read_text()).group(1)
    assert re.search(rf'target-version = "py{oldest.replace(".", "")}"', (REPO / "ruff.toml").read_text())
    unfit = []
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or "python_version" in line:
            continue
        requirement = Requirement(line)
        try:
            requires = metadata(requirement.name).get("Requires-Python") or ""
        except PackageNotFoundError:
            continue
        if not SpecifierSet(requires).contains(oldest):
            unfit.append(f"{line} (Requires-Python {requires})")
    assert not unfit, f"not installable on Python {oldest}: {unfit}"


def _heading_anchors(markdown: Path) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    heading numbered -1, -2, ...; headings inside fenced code blocks are not headings."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = re.match(r"^#{1,6}\s+(.*)", line)
        if fenced or not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _broken_links(markdown: Path) -> list[str]:
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", markdown.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", link):           # http(s):, mailto: ... not checked (no network in tests)
            continue
        path, _, anchor = link.partition("#")
        target = (markdown.parent / path).resolve() if path else markdown
        if not target.exists():
            broken.append(f"{markdown.relative_to(REPO)}: {link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in _heading_anchors(target):
            broken.append(f"{markdown.relative_to(REPO)}: {link} (no such heading)")
    return broken


def test_the_readme_and_docs_link_only_to_files_and_headings_that_exist():
    """Every relative link of the README and docs/ resolves from the file it is in (docs/ links are relative to
    docs/), and every #anchor names a heading of its target, as GitHub renders them."""
    assert _heading_anchors(REPO / "README.md") >= {"mcpilco_ros", "learning-the-robot-it-is-given-issue-15"}
    broken = [b for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))] for b in _broken_links(md)]
    assert not broken, "\n".join(broken)
