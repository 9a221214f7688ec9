"""fastrl's imports point one way: no module of the package imports one that (directly or through
others) imports it back, whether at module level or inside a function (a function-level import
hides a cycle; it does not remove it)."""
import ast
import functools
import sys
from pathlib import Path

import pytest

from tests.support.repo import REPO

ROOT = REPO
# kernels/ is installed as fastrl.kernels (setup.py package_dir).
SOURCES = {"fastrl": ROOT / "fastrl", "fastrl.kernels": ROOT / "kernels"}


def module_files() -> dict[str, Path]:
    modules = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if not name.startswith("fastrl.kernels") or package == "fastrl.kernels":
                modules[name] = path
    return modules


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """fastrl modules that ``name`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                origin = ".".join(base[:len(base) - node.level + 1] + ([origin] if origin else []))
            submodules = [f"{origin}.{alias.name}" for alias in node.names]
            # `from . import distributed` needs the submodule, not what the package itself defines
            targets = submodules + ([] if all(s in known for s in submodules) else [origin])
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


@functools.cache
def source_graph() -> dict[str, frozenset[str]]:
    modules = module_files()
    return {name: frozenset(imports_of(name, path, set(modules))) for name, path in modules.items()}


def import_graph() -> dict[str, set[str]]:
    """Module -> the fastrl modules it imports (parsed once per session; each call a fresh copy)."""
    return {name: set(imported) for name, imported in source_graph().items()}


def test_fastrl_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 20 and "fastrl.learner.runtime" in graph["fastrl.learner.process"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_learner_family_imports_down_only():
    graph = import_graph()
    shell = {"fastrl.learner.process", "fastrl.learner.runtime"}
    algorithms = {"fastrl.learner.factory", "fastrl.learner.vtrace", "fastrl.learner.dqn", "fastrl.learner.base",
                  "fastrl.learner.qlearning", "fastrl.learner.r2d2"}
    for module in algorithms:
        assert not graph[module] & shell, f"{module} imports the process shell"
    for module in ("fastrl.learner.losses", "fastrl.learner.batch", "fastrl.learner.replay_feed",
                   "fastrl.replay.buffer", "fastrl.models.networks"):
        assert not graph[module] & (shell | algorithms), f"{module} imports upwards"


def test_the_runner_family_imports_down_only():
    """fastrl.run.training composes its parts; each run mode stands apart from the other; the plan and
    the checks before the run know neither mode nor the supervisor."""
    graph = import_graph()
    entry, modes = "fastrl.run.training", {"fastrl.run.parallel", "fastrl.run.serial"}
    parts = modes | {"fastrl.run.preflight", "fastrl.run.supervisor", "fastrl.run.plan"}
    assert parts <= graph[entry] | {"fastrl.run.supervisor"} and "fastrl.run.supervisor" in graph["fastrl.run.parallel"]
    importers = {name for name, imported in graph.items() if entry in imported}
    assert importers <= {"fastrl", "fastrl.cli", "fastrl.profiler.measure"}
    for module in parts:
        assert entry not in graph[module], f"{module} imports the runner that composes it"
    assert not graph["fastrl.run.parallel"] & modes and not graph["fastrl.run.serial"] & modes
    for module in ("fastrl.run.preflight", "fastrl.run.plan", "fastrl.run.supervisor"):
        assert not graph[module] & modes, f"{module} imports a run mode"
    assert not graph["fastrl.run.plan"] & parts and not graph["fastrl.run.preflight"] & {"fastrl.run.supervisor"}


def test_the_slot_protocol_is_one_module_that_every_party_uses():
    """fastrl.ipc.slots needs only the config's limits; the worker, the batcher, the learner and
    the serial run all take the protocol from it."""
    graph = import_graph()
    assert graph["fastrl.ipc.slots"] <= {"fastrl.config.schema"}
    for module in ("fastrl.sampling.rollout_worker", "fastrl.sampling.batcher", "fastrl.learner.process",
                   "fastrl.run.serial"):
        assert "fastrl.ipc.slots" in graph[module], f"{module} does not use fastrl.ipc.slots"


# fastrl's subpackages (and its top-level modules) from the bottom up: a package imports only from
# the layers below its own (docs/contributing.md draws the same picture).
LAYERS = (
    {"kernels", "config", "files", "distributed", "user_code"},
    {"envs", "replay"},
    {"models"},
    {"ipc"},
    {"reporting", "multiagent"},
    {"evaluation", "sampling"},
    {"tuning"},
    {"learner"},
    {"run"},
    {"profiler", "__init__"},
    {"cli"},
)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_imports_only_from_the_layers_below_it():
    graph = import_graph()
    layer = {name: depth for depth, names in enumerate(LAYERS) for name in names}
    packages = {package_of(module) for module in graph}
    assert packages == set(layer), f"packages without a layer: {sorted(packages - set(layer))}"
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                    if package_of(module) != package_of(target)
                    and layer[package_of(target)] >= layer[package_of(module)])
    assert not upward, "imports that do not point down a layer: " + "; ".join(upward)


def test_config_and_kernels_import_nothing_of_fastrl():
    graph = import_graph()
    for module, targets in graph.items():
        if package_of(module) in ("config", "kernels"):
            assert {package_of(t) for t in targets} <= {package_of(module)}, f"{module} imports {sorted(targets)}"


def test_the_layer_check_finds_an_upward_import(monkeypatch):
    graph = import_graph()
    graph["fastrl.ipc.arena"] = graph["fastrl.ipc.arena"] | {"fastrl.run.training"}
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: graph)
    with pytest.raises(AssertionError, match="fastrl.ipc.arena -> fastrl.run.training"):
        test_every_package_imports_only_from_the_layers_below_it()
