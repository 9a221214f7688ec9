"""The tests of tests/unit/run/test_main_guard.py's subject that train in this process."""
from tests.unit.run.test_main_guard import run_script


def test_an_unguarded_train_call_stops_before_any_process_or_file(tmp_path):
    done = run_script(tmp_path, """\
        from fastrl.config import build_config
        from fastrl.run.training import train
        train(build_config("cartpole-appo", {"train_for_env_steps": 10_000}), run_dir="run")
        """)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert 'script.py:3, outside `if __name__ == "__main__":`' in last and "put the call under that guard" in last
    assert not (tmp_path / "run").exists()
