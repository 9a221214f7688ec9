"""The documentation against the repository: every path README.md and docs/*.md cite exists (and
every heading a link points into), and the README's set-up commands are the ones CI runs."""
import re
from pathlib import Path

import pytest

from tests.support.repo import REPO

ROOT = REPO
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A repository path in running text, backticks or a code block: a top-level folder, then a path.
# Not preceded by a path character, so `../profiles/x` (a link, checked relative to its page) and
# `RUN_DIR/checkpoints/x` (a run's file) are not taken for one.
CITED = re.compile(r"(?<![\w./-])((?:fastrl|kernels|scripts|profiles|tests|docs|\.ci)/[\w./*-]*[\w/*])")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def headings(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings (outside code blocks)."""
    anchors, in_code = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code and (match := re.match(r"#{1,6}\s+(.*)", line)):
            title = re.sub(r"[^\w\s-]", "", match[1].strip().lower())
            anchors.add(re.sub(r"\s", "-", title))
    return anchors


def cited_paths(page: Path) -> list[str]:
    return CITED.findall(page.read_text(encoding="utf-8"))


def broken_links(page: Path) -> list[str]:
    """Links (and images) of ``page`` whose file, relative to the page, or heading is missing."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in headings(file):
            broken.append(target)
    return broken


def missing(path: str) -> bool:
    return not (any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists())


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_cites_exists(page):
    assert [path for path in cited_paths(page) if missing(path)] == []
    assert broken_links(page) == []


def test_a_path_that_does_not_exist_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("The kernel (`fastrl/kernels/lstm.py`), scripts/nothing.py and `kernels/lstm.py`; runs in "
                    "`RUN_DIR/checkpoints/best.pt`.\n\n## A heading's anchor\n\n[here](#a-headings-anchor), "
                    "[there](missing.md), [gone](#no-such-heading) ![a curve](profiles/curves/none.png)\n")
    assert [p for p in cited_paths(page) if missing(p)] == ["fastrl/kernels/lstm.py", "scripts/nothing.py",
                                                              "profiles/curves/none.png"]
    assert broken_links(page) == ["missing.md", "#no-such-heading", "profiles/curves/none.png"]


def shell_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_the_readme_gives_two_set_up_commands_and_ci_runs_its_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    set_up = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    train, test = shell_blocks(set_up)
    assert train == "pip install torch==2.13.0 -e . && fastrl-train --profile cartpole-appo"
    install, _, command = test.partition(" && ")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == command == "python -m pytest -q -n 3 --dist worksteal tests"
    extras = re.search(r"-e '(\.\[[\w,]+\])'", install)[1]
    assert any(line.startswith("pip install") and f"-e '{extras}'" in line for line in ci)


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


# --- docs/metrics.md: generated from the one declaration of the metrics.jsonl keys --------------

def test_docs_metrics_md_is_current():
    from fastrl.reporting.metrics_reference import markdown

    assert (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8") == markdown(), \
        "regenerate: python -m fastrl.reporting.metrics_reference > docs/metrics.md"


def test_the_keys_a_config_turns_on_are_declared():
    """The keys of evaluation against opponents, self-play and a population (fastrl.tuning.search_space
    lists them per config), and the league's own report."""
    import numpy as np

    from fastrl.config import SelfPlayConfig, build_config
    from fastrl.reporting.metrics import declared
    from fastrl.tuning.search_space import objective_keys

    population = build_config("cartpole-appo", {"eval.every_s": 60.0, "pbt.population": 2, "env.info_keys": ["score"]})
    selfplay = build_config("cartpole-appo", {"eval.every_s": 60.0, "selfplay.enabled": True})
    selfplay.eval.opponents = ["random"]  # objective_keys reads the names only
    keys = objective_keys(population) | objective_keys(selfplay)
    assert {"eval/random/win_rate", "league/rating", "member/1/learner/loss", "member/0/info/score"} <= keys
    assert sorted(key for key in keys if not declared(key)) == []
    pytest.importorskip("openskill")
    from types import SimpleNamespace

    from fastrl.multiagent.league import LeagueRecord

    arena = SimpleNamespace(weight_version=np.array([5, 10, 20]), league_weights=np.zeros(2))
    report = LeagueRecord(arena, 1, SelfPlayConfig(), None, "main").record(np.array([10, 20]), np.array([1.0, -1.0]))
    assert sorted(key for key in report if not declared(key)) == []


def test_an_undeclared_key_is_found():
    from fastrl.reporting.metrics import declared

    assert declared("policy/left/learner/loss") and declared("member/2/eval_return_mean")
    assert not declared("policy/left/learner/no_such_stat") and not declared("learner/no_such_stat")


def test_the_index_lists_every_docs_page():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    listed = {target.partition("#")[0] for target in LINK.findall(index)}
    assert sorted(page.name for page in (ROOT / "docs").glob("*.md") if page.name not in listed | {"index.md"}) == []
