"""scripts/bench.py gpu: its budget (each section's share of what is left, the total a hard
bound), the test report it reads, and the whole report on the CPU (--device cpu --quick): every
section present, with figures or the reason it has none."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.scripts import SCRIPTS, load_benchmark

gpu = load_benchmark("gpu")
Section = gpu.Section


def test_a_section_gets_its_share_of_what_is_left():
    assert gpu.share_of_remaining(100.0, [1.0, 3.0]) == 25.0
    # What the first section did not use goes to the later ones: the last one takes all that is left.
    assert gpu.share_of_remaining(60.0, [2.0]) == 60.0
    assert gpu.share_of_remaining(0.0, [1.0]) == gpu.share_of_remaining(-5.0, [1.0]) == 0.0


def test_a_section_is_raised_to_its_minimum_or_skipped_below_it():
    small, big = Section("small", "", 0.1, 20.0), Section("big", "", 0.9, 30.0)
    assert gpu.section_budget(400.0, [small, big]) == pytest.approx(40.0)
    assert gpu.section_budget(100.0, [small, big]) == 20.0  # its share, 10 s, raised to its minimum
    assert gpu.section_budget(19.0, [small, big]) is None
    assert gpu.section_budget(25.0, [big]) is None
    assert gpu.section_budget(100.0, [big]) == 100.0


def test_the_budget_keeps_the_stop_and_the_report_inside_the_total():
    now = [1000.0]
    budget = gpu.Budget(120.0, clock=lambda: now[0])
    total_for_sections = 120.0 - gpu.STOP_GRACE_S - gpu.REPORT_RESERVE_S
    assert budget.remaining() == total_for_sections
    assert budget.wait_s(10.0) == 10.0 + gpu.OVERRUN_S  # a section may finish its last row
    now[0] += total_for_sections - 3.0
    assert budget.wait_s(10.0) == pytest.approx(3.0)  # but never past the deadline
    assert budget.for_section(list(gpu.SECTIONS)) is None
    now[0] += 60.0
    assert budget.remaining() == 0.0


def test_every_section_starts_in_a_budget_of_eight_minutes():
    remaining = gpu.DEFAULT_MINUTES * 60 - gpu.STOP_GRACE_S - gpu.REPORT_RESERVE_S
    for i, section in enumerate(gpu.SECTIONS):
        seconds = gpu.section_budget(remaining, list(gpu.SECTIONS[i:]))
        assert seconds is not None and seconds >= section.minimum_s, section.name
        remaining -= seconds  # the worst case: every section takes all of its budget
    assert remaining >= 0


def test_a_profile_is_measured_only_where_its_three_runs_fit():
    from fastrl.profiler import STARTUP_ESTIMATE_S
    assert gpu.profile_seconds(2 * STARTUP_ESTIMATE_S, quick=False) is None
    long = gpu.profile_seconds(2 * STARTUP_ESTIMATE_S + 90.0, quick=False)
    assert 25.0 < long < 30.0  # 30 s each, less the warm-up
    assert gpu.profile_seconds(2 * STARTUP_ESTIMATE_S + 90.0, quick=True) < 2.0


def test_the_test_report_reads_passes_failures_and_skips(tmp_path):
    xml = tmp_path / "tests.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.integration.test_gpu_device" name="test_a" time="0.1" />'
        '<testcase classname="tests.integration.test_gpu_device" name="test_b[cuda]" time="0.1">'
        '<failure message="AssertionError: 1 != 2&#10;more lines">trace</failure></testcase>'
        '<testcase classname="tests.integration.test_gpu_device" name="test_c" time="0">'
        '<skipped type="pytest.skip" message="no CUDA device">why</skipped></testcase>'
        '</testsuite></testsuites>')
    assert gpu.junit_tests(xml) == [
        {"test": "tests/integration/test_gpu_device.py::test_a", "outcome": "passed", "message": ""},
        {"test": "tests/integration/test_gpu_device.py::test_b[cuda]", "outcome": "failed",
         "message": "AssertionError: 1 != 2"},
        {"test": "tests/integration/test_gpu_device.py::test_c", "outcome": "skipped", "message": "no CUDA device"}]


def test_the_report_collects_the_files_that_mark_gpu_tests():
    files = gpu.gpu_test_files(SCRIPTS.parent / "tests")
    assert "tests/integration/test_gpu_device.py" in files and "tests/benchmarks/test_bench_gpu.py" not in files


def test_a_section_that_failed_or_was_not_reached_says_so_in_the_markdown():
    report = {"command": "python scripts/bench.py gpu", "device": "cuda", "quick": False, "budget_s": 480.0,
              "wall_s": 30.0, "finished": False,
              "sections": {"tests": {"status": "failed", "error": "exit 1: ImportError: no module named x"},
                           "syncs": {"status": "stopped", "reason": "stopped at its budget of 20 s",
                                     "rows": {"DQNLearner.train": {"device": {"syncs": 4, "to_host": 2, "to_device": 1},
                                                                   "cpu_forced": {"syncs": 6}}}}},
              "gpu_use": {"status": "skipped", "reason": "no CUDA device"}}
    text = gpu.markdown(report)
    assert "unfinished" in text
    assert "**failed**: exit 1: ImportError: no module named x" in text
    assert "| DQNLearner.train | 4 | 2 | 1 | 6 |" in text
    assert text.count("Not reached.") == len(gpu.SECTIONS) - 2
    assert "**skipped**: no CUDA device" in text


def test_the_quick_report_on_the_cpu_has_every_section(tmp_path):
    """The whole report, as a GPU runs it, on the CPU. Each section ends when it has measured (about
    a minute in all on 2 idle cores); the budget is the full report's, not --quick's, so that a busy
    machine still measures every section."""
    out, minutes = tmp_path / "report", gpu.DEFAULT_MINUTES
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), "gpu", "--device", "cpu", "--quick",
                           "--minutes", str(minutes), "--out", str(out)], capture_output=True,
                          text=True, timeout=minutes * 60 + 60, env={**os.environ, "PYTHONPATH": str(SCRIPTS.parent)})
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    sections = report["sections"]
    assert report["finished"] and report["wall_s"] <= minutes * 60
    assert list(sections) == [section.name for section in gpu.SECTIONS]
    not_ok = {name: (section["status"], section.get("reason") or section.get("error"))
              for name, section in sections.items() if section["status"] != "ok"}
    assert not not_ok, not_ok  # only the sections at fault: a full dict is cut short by pytest

    hardware = sections["hardware"]
    assert hardware["cpu_count"] >= 1 and hardware["torch"] and hardware["gpus"] == []
    assert hardware["note"] == "no CUDA device"

    tests = {t["test"]: t for t in sections["tests"]["tests"]}
    cuda_test = tests["tests/integration/test_gpu_device.py::test_bfloat16_on_cuda_trains_close_to_float32"]
    assert (cuda_test["outcome"], cuda_test["message"]) == ("skipped", "no CUDA device")
    each_rank = tests["tests/integration/test_gpu_device.py::test_each_rank_of_a_node_gets_its_own_gpu"]
    assert each_rank["outcome"] == "passed"

    for name, row in sections["syncs"]["rows"].items():
        assert row["device"] is None and row["cpu_forced"]["syncs"] >= 1, name

    precision = sections["precision"]["rows"]
    assert set(precision) == {"float32", "bfloat16"} and all(r["seconds_per_call"] > 0 for r in precision.values())

    rows = sections["throughput"]["rows"]
    assert rows["cartpole-appo"]["env_fps"] > 0 and rows["cartpole-appo"]["train_fps"] > 0
    assert rows["cartpole-appo"]["bottleneck"]
    assert rows["atari-appo, batcher on the CPU"]["status"] == "skipped"
    assert "cartpole-appo only" in rows["atari-appo, batcher on the CPU"]["reason"]

    learning = sections["learning"]
    assert learning["profile"] == "cartpole-appo" and learning["outcome"]["last_env_steps"] >= gpu.QUICK_LEARNING_STEPS
    assert learning["outcome"]["final"] > 0
    assert learning["promise"]["threshold"] == 475
    assert (out / learning["plot"]).is_file()

    assert report["gpu_use"] == {"status": "skipped",
                                 "reason": "no CUDA device (no NVML, no nvidia-smi, no CUDA allocation)"}
    text = (out / "report.md").read_text()
    for section in gpu.SECTIONS:
        assert f"## {section.title}" in text
    assert "| cartpole-appo |" in text and "![cartpole-appo learning curve](learning.png)" in text
    assert "Not reached." not in text and "unfinished" not in text
