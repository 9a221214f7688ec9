"""A script that calls fastrl.train() outside `if __name__ == "__main__":` is refused in one line
before any child starts (spawned children re-run the script; see fastrl.run.main_guard)."""
import subprocess
import sys
import textwrap
from pathlib import Path

from fastrl.run.main_guard import unguarded_main_call


def run_script(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_the_guard_is_told_apart_from_a_top_level_call(tmp_path):
    done = run_script(tmp_path, """\
        from fastrl.run.main_guard import unguarded_main_call
        def train_like():
            return unguarded_main_call()
        top = train_like()
        if "__main__" == __name__:
            print(top.endswith("script.py:4"), train_like())
        """)
    assert done.stdout.split() == ["True", "None"], done.stderr


def test_without_a_main_script_there_is_nothing_to_check():
    assert unguarded_main_call() is None  # pytest's __main__ calls no train() at its top level
