"""environment.yml (conda) and pyproject.toml (pip) must list the same packages."""
import re

import pytest
try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent


def pyproject_deps(text=None):
    data = tomllib.loads(text or (ROOT / "pyproject.toml").read_text())
    deps = list(data["project"]["dependencies"])
    for extra in data["project"].get("optional-dependencies", {}).values():
        deps += extra
    return sorted(deps)


def environment_deps(text=None):
    text = text or (ROOT / "environment.yml").read_text()
    deps, in_pip = [], False
    for line in text.splitlines():
        if re.match(r"^\s*-\s*pip:\s*$", line):
            in_pip = True
            continue
        m = re.match(r"^\s{6,}-\s*(.+?)\s*$", line)
        if in_pip and m:
            if not m.group(1).startswith("-e"):
                deps.append(m.group(1))
        elif in_pip and line.strip() and not line.startswith(" " * 6):
            in_pip = False
    return sorted(deps)


def test_same_dependencies():
    assert pyproject_deps() == environment_deps()


def test_mismatch_is_caught():
    env = (ROOT / "environment.yml").read_text().replace("numpy>=1.26", "numpy>=1.20")
    with pytest.raises(AssertionError):
        assert pyproject_deps() == environment_deps(env)
    missing = (ROOT / "environment.yml").read_text().replace("      - tqdm>=4.66\n", "")
    assert pyproject_deps() != environment_deps(missing)
