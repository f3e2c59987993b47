"""The folders show the layers, and the imports keep to them: a module imports only from its own
layer or the ones below, so no import arrow points up and no import cycle can form. The layers,
bottom to top, are the package's folders (docs/design.md: Code map)."""
from __future__ import annotations

from pipeline.config import stages

# Bottom to top. The top-level modules (pipeline/*.py) are the top layer.
LAYERS = ["runtime", "config", "costmodel", "strategies", "data", "detection", "training",
          "measure", "commbench", "report", "(top)"]
PACKAGE_DIR = stages.ROOT / "pipeline"


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "(top)"  # pipeline/__init__.py
    if parts[1] in LAYERS:
        return parts[1]
    return "(top)"


def every_module() -> list[str]:
    modules = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(stages.ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.append(".".join(parts))
    return modules


def imports_of(module: str) -> set[str]:
    """The pipeline modules `module` imports; `from .. import x` names the root package,
    which holds nothing."""
    return stages._imports(stages._module_file(module), module) - {"pipeline"}


def test_every_folder_is_a_layer():
    folders = {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"(top)"}


def test_no_import_points_to_a_higher_layer():
    upward = []
    for module in every_module():
        here = LAYERS.index(layer_of(module))
        for imported in imports_of(module):
            there = LAYERS.index(layer_of(imported))
            if there > here:
                upward.append(f"{module} ({LAYERS[here]}) imports {imported} ({LAYERS[there]})")
    assert upward == []


def test_no_import_cycle():
    graph = {module: {m for m in imports_of(module) if m != module and m in set(every_module())}
             for module in every_module()}
    # A package imports its own modules (its __init__ re-exports); those edges are not cycles of
    # the design, so only module-to-module edges across different files count.
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if nxt == node.rpartition(".")[0] or node == nxt.rpartition(".")[0]:
                continue  # a module and its own package
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert cycles == []
