"""Every ```python block of the README and docs/ runs, each as a script of its own in an empty
directory, so the research-code entry points (your own env and network, the learner on your own
batches, the losses, the replay, an exported policy) cannot drift from their docs. A block that is
not meant to run is fenced as another language (bash, text)."""
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.repo import REPO

ROOT = REPO
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
RUN_S = 300


def python_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


BLOCKS = [(str(page.relative_to(ROOT)), i) for page in PAGES for i in range(len(python_blocks(page)))]


def test_blocks_are_found_and_other_fences_are_not_taken():
    text = "```python\nx = 1\n```\n```bash\nfastrl-train\n```\n```\ntext\n```\n```python\ny = 2\n```\n"
    assert BLOCK.findall(text) == ["x = 1\n", "y = 2\n"]
    pages = {page for page, _ in BLOCKS}
    assert {"README.md", "docs/api.md", "docs/evaluation.md"} <= pages


def run_script(code: str, cwd: Path, without_fastrl: bool = False) -> subprocess.CompletedProcess:
    """``code`` run as ``cwd/example.py`` (as ``__main__``) with the repository importable; with
    ``without_fastrl``, ``import fastrl`` fails in it."""
    (cwd / "example.py").write_text(code)
    runner = "import runpy, sys\n"
    if without_fastrl:
        runner += "sys.modules['fastrl'] = None\n"
    runner += "runpy.run_path('example.py', run_name='__main__')\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", runner], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=RUN_S)


def test_a_failing_block_fails_and_fastrl_can_be_kept_out(tmp_path):
    assert run_script("raise SystemExit(3)\n", tmp_path).returncode == 3
    assert run_script("import fastrl.config.schema\n", tmp_path).returncode == 0
    assert "ModuleNotFoundError" in run_script("import fastrl.config.schema\n", tmp_path, without_fastrl=True).stderr


