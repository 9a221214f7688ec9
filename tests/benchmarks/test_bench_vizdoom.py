"""scripts/bench.py vizdoom without training: Sample Factory's log read into reports, the steady
frames/s and time to a score of a run, and one-line refusals of bad input."""
import pytest

from tests.support.scripts import load_benchmark, load_script

bench = load_benchmark("vizdoom")
entry = load_script("bench")

# As Sample Factory 2.1.1 prints them, colours included.
SF_LOG = """\
\x1b[36m[2026-11-26 06:24:25,611][19880] register_encoder_factory: <function make_vizdoom_encoder>\x1b[0m
\x1b[36m[2026-11-26 06:24:40,626][19880] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0. \
Throughput: 0: nan. Samples: 1142. Policy #0 lag: (min: -1.0, avg: -1.0, max: -1.0)\x1b[0m
\x1b[36m[2026-11-26 06:24:40,627][19880] Avg episode reward: [(0, '-1.434')]\x1b[0m
\x1b[36m[2026-11-26 06:24:45,625][19880] Fps is (10 sec: 1638.3, 60 sec: 1638.3, 300 sec: 1638.3). \
Total num frames: 8192. Throughput: 0: 236.0. Samples: 2322.\x1b[0m
\x1b[36m[2026-11-26 06:24:45,627][19880] Avg episode reward: [(0, '0.5')]\x1b[0m
\x1b[37m\x1b[1m[2026-11-26 06:24:47,442][19880] Heartbeat connected on Batcher_0\x1b[0m
\x1b[36m[2026-11-26 06:24:55,625][19880] Fps is (10 sec: 1228.8, 60 sec: 1365.3, 300 sec: 1365.3). \
Total num frames: 20480. Throughput: 0: 310.8. Samples: 5804.\x1b[0m
"""


def test_sample_factory_reports_are_timed_from_its_first_line_and_unscaled():
    reports = bench.sf_reports(SF_LOG, reward_scale=0.01)
    assert [r.seconds for r in reports] == pytest.approx([15.015, 20.014, 30.014])
    assert [r.frames for r in reports] == [0, 8192, 20480]
    assert [r.episode_return for r in reports] == pytest.approx([-143.4, 50.0, None])


def test_a_shaped_reward_is_no_score():
    assert [r.episode_return for r in bench.sf_reports(SF_LOG, reward_scale=None)] == [None, None, None]


def test_steady_rate_counts_from_warmup_after_the_first_frames():
    Report = bench.Report
    reports = [Report(10.0, 0, None), Report(20.0, 0, None), Report(30.0, 1000, None), Report(40.0, 5000, None),
               Report(50.0, 9000, None), Report(60.0, 14000, None)]
    # frames start at 30 s: with 10 s of warm-up the window is 40 s .. 60 s
    assert bench.steady_frames_per_s(reports, warmup=10.0) == pytest.approx((14000 - 5000) / 20)
    assert bench.steady_frames_per_s(reports, warmup=25.0) is None  # one report left
    assert bench.steady_frames_per_s(reports[:2], warmup=0.0) is None  # no frames at all


def test_time_to_score_is_the_first_report_at_or_above_it():
    Report = bench.Report
    reports = [Report(10.0, 1, None), Report(20.0, 2, -50.0), Report(30.0, 3, 60.0), Report(40.0, 4, 80.0)]
    assert bench.seconds_to_score(reports, 60.0) == 30.0
    assert bench.seconds_to_score(reports, 90.0) is None


def test_rounds_alternate_which_side_runs_first():
    assert [bench.round_order(r) for r in range(3)] == [("fastrl", "sample-factory"), ("sample-factory", "fastrl"),
                                                        ("fastrl", "sample-factory")]


@pytest.mark.parametrize("argv, message", [
    (["--scenario", "health", "--score", "1000"], "shapes its reward"),
    (["--set", "env.frame_skip=2"], "--set env.frame_skip: both runs take these from the profile vizdoom-basic"),
    (["--sf-python", "/no/such/python"], "--sf-python /no/such/python does not exist"),
    (["--warmup", "100", "--seconds", "60"], "--warmup (100.0) must be >= 0 and below --seconds (60.0)"),
])
def test_bad_input_is_one_line_before_any_run(argv, message, capsys, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    sf_python = [] if "--sf-python" in argv else ["--sf-python", str(python)]
    assert entry.main(["vizdoom", *sf_python, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
