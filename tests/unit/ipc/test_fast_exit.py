"""fastrl.ipc.fast_exit: a process that asked for it skips the final collection at exit (the
objects it froze are not walked, so cyclic garbage left at exit is not finalized), and
fastrl's commands ask for it."""
import atexit
import subprocess
import sys
import textwrap

import pytest

from fastrl import cli
from fastrl.ipc import fast_exit

# Cyclic garbage whose finalizer leaves a mark: only the interpreter's final collection, which
# walks every tracked object, can find and finalize it.
LEAVE_A_CYCLE = """
    import gc, sys
    gc.disable()  # no collection before exit finds the cycle
    class Mark:
        def __del__(self):
            sys.stdout.write("finalized\\n")
            sys.stdout.flush()
    cycle = Mark()
    cycle.self = cycle
    del cycle
"""


def exit_output(ask: bool) -> str:
    code = textwrap.dedent(LEAVE_A_CYCLE) + ("from fastrl.ipc.fast_exit import skip_final_collection\n"
                                             "skip_final_collection()\n" if ask else "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_final_collection_is_skipped_only_where_asked():
    assert exit_output(ask=False) == "finalized\n"
    assert exit_output(ask=True) == ""


def test_asking_twice_registers_once(monkeypatch):
    monkeypatch.setattr(fast_exit, "_registered", False)
    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    fast_exit.skip_final_collection()
    fast_exit.skip_final_collection()
    assert len(registered) == 1


@pytest.mark.parametrize("main, argv", [(cli.train_main, ["--list-keys"]),
                                        (cli.plot_main, ["/nonexistent/run", "--out", "/nonexistent/curves.png"])])
def test_fastrl_commands_ask_for_it(monkeypatch, capsys, main, argv):
    asked = []
    monkeypatch.setattr(cli, "skip_final_collection", lambda: asked.append(True))
    main(argv)
    assert asked == [True]
