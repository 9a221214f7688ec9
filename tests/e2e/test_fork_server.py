"""fastrl.ipc.start's fork server and its stop when fastrl-train is refused after starting it, in
fresh interpreters: this one's fork server serves the other tests' runs, and a unit test starts no
process of fastrl's."""
import subprocess
import sys
import textwrap


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_a_fork_server_stopped_at_once_is_gone_and_reaped():
    done = run_python("""
        import psutil
        from fastrl.ipc.start import child_context, fork_server_pid, stop_fork_server

        assert fork_server_pid() is None
        child_context()  # returns at once: the server imports torch, numba and envpool for seconds
        pid = fork_server_pid()
        assert psutil.Process(pid).ppid() == psutil.Process().pid
        stop_fork_server()
        assert fork_server_pid() is None and not psutil.pid_exists(pid)  # killed, and reaped: no zombie
        stop_fork_server()  # a no-op once none runs
        print("ok")
        """)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]


def test_a_refused_fastrl_train_stops_the_fork_server_it_started_before_it_exits(tmp_path):
    # The run directory holds a run and --resume is not given: train() refuses it once this process
    # has imported torch, the fork server started before that still importing or just done.
    (tmp_path / "config.toml").write_text("")
    done = run_python(f"""
        import psutil
        from fastrl.cli import train_main
        from fastrl.ipc import start

        started = []
        original = start.child_context
        def child_context():
            ctx = original()
            started.append(start.fork_server_pid())
            return ctx
        start.child_context = child_context
        assert train_main(["--run-dir", {str(tmp_path)!r}, "--quiet"]) == 2
        pid = started[0]  # train() may ask again for the server fastrl-train started
        assert set(started) == {{pid}} and start.fork_server_pid() is None and not psutil.pid_exists(pid)
        print("ok")
        """)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]
    # The last line: the server shares stderr, and may have warned while it imported.
    assert "already holds a run" in done.stderr.strip().splitlines()[-1], done.stderr


def test_a_forked_child_starts_with_what_each_child_would_import_on_first_use(tmp_path):
    # A learner's first optimizer imports torch._dynamo, and a process's first numba kernel loads
    # numba's registries (numba.cpython.mathimpl among them): the fork server does both once.
    report = tmp_path / "modules"
    done = run_python(f"""
        from fastrl.ipc.start import child_context, stop_fork_server

        code = ("import gc, sys; open({str(report)!r}, 'w').write(' '.join(m for m in "
                "('torch._dynamo', 'numba.cpython.mathimpl') if m in sys.modules) "
                "+ f' frozen={{gc.get_freeze_count() > 0}}')")
        child = child_context().Process(target=exec, args=(code,))
        child.start()
        child.join(60)
        assert child.exitcode == 0, child.exitcode
        stop_fork_server()
        print("ok")
        """)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]
    # It also freezes what it imported (fastrl.ipc.fast_exit), which the child inherits.
    assert report.read_text() == "torch._dynamo numba.cpython.mathimpl frozen=True"
