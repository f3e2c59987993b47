"""Each package's docstring is a true map of its folder (the twin of test_layers.py). The rule:
every module of the folder appears in its package's docstring as `name.py` (`__init__.py`
aside), every sub-package as `name/`; and every entry of the map, an indented line that
begins with a lower-case `name.py` or `name/`, names one that is there. Prose may mention
other files anywhere else in a line."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline.config import stages

PACKAGE_DIR = stages.ROOT / "pipeline"
PACKAGES = [PACKAGE_DIR] + sorted(p for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").exists())
ENTRY = re.compile(r"^\s+([a-z_][a-z0-9_]*(?:\.py\b|/))", re.MULTILINE)


def contents(package: Path) -> set[str]:
    """The package's modules as `name.py` and its sub-packages as `name/`."""
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    return modules | {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}


def docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text()), clean=False) or ""


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.relative_to(stages.ROOT).as_posix())
def test_the_docstring_names_every_module_and_no_other(package):
    text = docstring(package)
    missing = sorted(name for name in contents(package)
                     if not re.search(rf"(?<![\w/.]){re.escape(name)}", text))
    stale = sorted(set(ENTRY.findall(text)) - contents(package))
    assert not missing, f"{package}/__init__.py: its docstring does not name {missing}"
    assert not stale, f"{package}/__init__.py: its docstring maps {stale}, not in the folder"


# --- the code map of docs/design.md -------------------------------------------------------------
# Its table's first cells name paths (`Snakefile`, `pipeline/runtime/`, `pipeline/launch.py`, ...):
# every folder of pipeline/ and every top-level module is mapped, and every path it names is there.

DESIGN = stages.ROOT / "docs" / "design.md"


def code_map() -> list[str]:
    """The paths the first cells of the code map (the table under `## Code map`) name."""
    section = DESIGN.read_text().split("\n## Code map\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [path for row in rows for path in re.findall(r"`([^`]+)`", row.split("|")[1])]


def test_the_code_map_names_every_package_and_top_module():
    mapped = set(code_map())
    expected = {f"pipeline/{p.name}/" for p in PACKAGES[1:]} | {
        f"pipeline/{p.name}" for p in PACKAGE_DIR.glob("*.py") if p.name != "__init__.py"}
    assert not expected - mapped, f"docs/design.md's code map does not name {sorted(expected - mapped)}"
    missing = sorted(path for path in mapped if not (stages.ROOT / path).exists())
    assert not missing, f"docs/design.md's code map names {missing}, not in the tree"
