"""The tests of tests/unit/envs/test_spaces.py's subject that start fastrl's commands or processes."""
from fastrl.cli import train_main
from tests.unit.envs.test_spaces import FAULT


def test_unsupported_space_from_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    code = train_main(["--env", FAULT + "make_unsupported_space",
                       "--set", 'env.kwargs={kind = "sequence", nested = true}',
                       "--set", "device=cpu", "--run-dir", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Sequence at key path 'inner.items'" in err and "Traceback" not in err
