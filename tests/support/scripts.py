"""scripts/ as modules, for the tests of the benchmarks: the entry point scripts/bench.py and the
benchmark modules of scripts/benchmarks/ it dispatches to."""
import importlib
import importlib.util
import sys

from tests.support.repo import REPO

SCRIPTS = REPO / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.append(str(SCRIPTS))  # as when a script runs as a file: benchmarks/ is importable


def load_script(name: str):
    """scripts/NAME.py as a module named NAME."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str):
    """scripts/benchmarks/NAME.py, the module scripts/bench.py runs for a subcommand."""
    return importlib.import_module(f"benchmarks.{name}")
