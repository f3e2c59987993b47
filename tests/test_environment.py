"""The set-up a new user meets: one lock used everywhere, README commands that CI runs, and a
Dockerfile that is correct by construction (no Docker engine runs here: hadolint checks it)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from .conftest import REPO, unit

LOCK = REPO / "requirements.lock"


def lock_entries() -> dict[str, str]:
    entries = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-!]+)", line.strip()).groups()
            entries[name.lower().replace("_", "-")] = version
    return entries


def test_lock_pins_names_and_versions_only():
    text = LOCK.read_text()
    assert "://" not in text and "--index" not in text and "--hash" not in text
    entries = lock_entries()
    assert entries["torch"] == "2.14.1" and entries["torchvision"] == "0.29.1"
    assert entries["snakemake"].startswith("9.") and entries["dvc"].startswith("3.")
    assert {"pycocotools", "pandas", "seaborn", "pytest"} <= set(entries)


def test_lock_covers_every_declared_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for deps in project["optional-dependencies"].values() for d in deps]
    entries = lock_entries()
    for requirement in map(Requirement, declared):
        name = requirement.name.lower().replace("_", "-")
        assert name in entries, f"{name} missing from requirements.lock"
        assert requirement.specifier.contains(entries[name]), f"{name}=={entries[name]} vs {requirement}"


def test_installed_environment_is_the_lock():
    """What the tests run in is exactly what the lock says (transitive packages included)."""
    wrong = {}
    for name, version in lock_entries().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed is None or installed.split("+")[0] != version.split("+")[0]:
            wrong[name] = (version, installed)
    assert not wrong


def commands(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_ci_runs_the_readme_test_command():
    readme = commands((REPO / "README.md").read_text())
    test_command = next(c for c in readme if c.endswith("-m pytest"))
    workflow_command = next(c for c in readme if c.endswith("snakemake --cores all"))
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == test_command
    # One set-up for both: the same environment from the same lock, the same paper toolchain
    # (the Dockerfile installs it from the same list).
    assert workflow_command.split("&&")[-3:-1] == test_command.split("&&")[-3:-1]
    assert "apt/paper.txt" in workflow_command and "apt/paper.txt" in test_command
    assert "apt/tests.txt" in test_command
    assert "apt/paper.txt" in (REPO / "Dockerfile").read_text()


def test_dockerfile_installs_the_lock_and_passes_hadolint():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+-runtime-", dockerfile, re.M)
    assert "requirements.lock" in dockerfile and "pip install --no-cache-dir -r /tmp/requirements.lock" in dockerfile
    assert re.search(r"^USER (?!root|0)", dockerfile, re.M)
    assert 'CMD ["snakemake", "--cores", "all"]' in dockerfile
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    result = subprocess.run([hadolint, "Dockerfile"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_shows_the_gpu_docker_run():
    readme = (REPO / "README.md").read_text()
    assert re.search(r"docker run --gpus all --ipc=host -v \S+results:/workspace/results", readme)


def test_a_test_worker_runs_whole_units():
    """What shares a fixture stays on one test process: a folder's tests (their conftest's
    session fixture, which no test outside can ask for), a file's tests (module fixtures)."""
    assert unit("tests/finished_demo/test_workflow.py::test_a[x/y]") == "tests/finished_demo"
    assert unit("tests/finished_demo/test_integrity.py::test_b") == "tests/finished_demo"
    assert unit("tests/test_strategies.py::test_c[ps/colocated]") == "tests/test_strategies.py"
