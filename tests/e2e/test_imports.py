"""The tests of tests/unit/test_imports.py's subject that start fastrl's commands or processes."""
import subprocess
import sys


def test_the_package_exports_train_and_build_config_without_importing_the_runner():
    code = ("import sys, fastrl; assert 'fastrl.run.training' not in sys.modules; "
            "from fastrl import build_config, train; from fastrl.run.training import train as runner_train; "
            "assert train is runner_train; assert build_config('cartpole-appo').env.id == 'CartPole-v1'; "
            "import pytest; pytest.raises(AttributeError, getattr, fastrl, 'trian')")
    subprocess.run([sys.executable, "-c", code], check=True)
