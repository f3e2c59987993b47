"""Where a result came from: params, seed, code revision, package versions, hardware, threads."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import typing
from importlib import metadata

PACKAGES = ("torch", "torchvision", "numpy", "pillow", "pycocotools", "snakemake", "dvc")


def git_revision() -> str:
    """HEAD's commit, with '-dirty' when tracked files differ from it. Outside a checkout (the
    container image) the revision it was built from, passed in as BENCH_GIT_REVISION."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("BENCH_GIT_REVISION", "unknown")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def cpu_model() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_driver() -> str | None:
    """The NVIDIA driver's version through NVML, None where there is no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # no library, no driver, no GPU: nothing to record
        return None


def hardware() -> dict:
    info: dict[str, typing.Any] = {
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
        "os": platform.platform(),
    }
    if "torch" in sys.modules or _importable("torch"):
        import torch

        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["cuda"] = torch.version.cuda
            info["driver"] = gpu_driver()
    return info


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def collect(params: dict, **run_facts) -> dict:
    """One provenance record: the params the stage used plus facts about this run and machine."""
    return {
        "params": params,
        "git_revision": git_revision(),
        "packages": package_versions(),
        "hardware": hardware(),
        "argv": sys.argv,
        **run_facts,
    }
