"""What a test leaves behind for the next one. Imports: the modules a test imported from a tree of its own are
forgotten after it (conftest's isolated_imports). Processes: nothing the tests start outlives them; the process
groups the fixtures start are stopped whole however their setup ends (github_emulator.local.ProcessGroup), and
the test run fails when a process it started is still alive after it (tests/leftover_processes.py, run by
scripts/test.sh and so by .ci/run)."""
from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from github_emulator.local import ProcessGroup
from tests.conftest import ROOT, _imported_from_a_test_tree, imports_forgotten_after, wait_for
from tests.runner_support import write_tree

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the check needs Linux's subreaper")

# Starts a sleeper in a session of its own (as the tests start servers), writes its pid, and exits without
# stopping it: the sleeper is orphaned, as a fixture's server is when its teardown never runs.
LEAK = textwrap.dedent("""
    import subprocess, sys
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # leaked-on-purpose"],
                               start_new_session=True)
    open(sys.argv[1], "w").write(str(sleeper.pid))
    sys.exit(int(sys.argv[2]))
""")


def checked(*command: str, grace: float = 1.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.leftover_processes", "--grace", str(grace), "--", *command],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_trees_modules_and_sys_path_entries_are_forgotten_after_the_block(tmp_path):
    # models/ without __init__.py: a namespace package, like tests/fixtures/models, whose leftover once made the
    # next test's `from models import Net` fail with "cannot import name 'Net' from 'models' (unknown location)"
    tree = write_tree(tmp_path, {"models/net.py": "class Net:\n    pass\n",
                                 "train.py": "from models.net import Net\n\nMODEL = Net\n"})
    path = list(sys.path)
    with imports_forgotten_after():
        sys.path.insert(0, str(tree))
        train = importlib.import_module("train")
        assert train.MODEL.__module__ == "models.net"
    assert not {"train", "models", "models.net"} & set(sys.modules)
    assert sys.path == path


@pytest.mark.parametrize("name", ["json", "torch.classes", "gpu_runner.build", "tests.runner_support"])
def test_libraries_and_our_own_modules_stay_imported(name):
    pytest.importorskip(name)
    assert not _imported_from_a_test_tree(name, sys.modules[name])


# The group's first process starts a second one in its group that ignores SIGTERM (a worker finishing a job),
# writes both pids, then exits or waits.
GROUP = textwrap.dedent("""
    import os, subprocess, sys, time
    member = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); time.sleep(300)"])
    open(sys.argv[1], "w").write(f"{os.getpid()} {member.pid}")
    if sys.argv[2] == "wait":
        time.sleep(300)
""")


def started_group(tmp_path: Path, then: str) -> tuple[ProcessGroup, list[int]]:
    pid_file = tmp_path / "pids"
    group = ProcessGroup([sys.executable, "-c", GROUP, str(pid_file), then], tmp_path / "group.log", grace=2)
    wait_for(lambda: pid_file.exists() and len(pid_file.read_text().split()) == 2, 120, "the group's two processes")
    return group, [int(pid) for pid in pid_file.read_text().split()]


def test_a_process_group_is_stopped_whole_when_the_setup_using_it_fails(tmp_path):
    with pytest.raises(RuntimeError, match="setup failed"):
        with started_group(tmp_path, "wait")[0] as group:
            pids = [group.proc.pid, int((tmp_path / "pids").read_text().split()[1])]
            raise RuntimeError("setup failed")  # e.g. a health check that timed out
    assert not any(running(pid) for pid in pids) and group.log.closed


def test_a_process_group_whose_first_process_has_exited_is_still_stopped_whole(tmp_path):
    group, (leader, member) = started_group(tmp_path, "exit")
    wait_for(lambda: group.proc.poll() is not None, 120, "the first process to exit")
    assert running(member)
    group.stop()  # the member ignores SIGTERM: it is killed after the grace
    assert not running(member)


@linux_only
@pytest.mark.parametrize("code", [0, 3])
def test_a_process_left_running_fails_the_run_is_named_and_killed(tmp_path, code):
    pid_file = tmp_path / "pid"
    done = checked(sys.executable, "-c", LEAK, str(pid_file), str(code))
    pid = int(pid_file.read_text())
    assert done.returncode == (code or 1), done.stderr  # the command's own failure is kept
    assert "1 process(es) started by" in done.stderr and "still running" in done.stderr
    assert f"pid {pid}: {sys.executable} -c import time; time.sleep(300)  # leaked-on-purpose" in done.stderr
    assert not running(pid)


@linux_only
def test_a_command_that_stops_what_it_starts_keeps_its_exit_status(tmp_path):
    clean = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass']); sys.exit(int(sys.argv[1]))"
    for code in (0, 5):
        done = checked(sys.executable, "-c", clean, str(code))
        assert done.returncode == code and done.stderr == ""


@linux_only
def test_a_process_still_exiting_within_the_grace_is_not_a_leftover():
    # the orphan ends a moment after the command: a server finishing its shutdown
    lingering = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.5)'], "
                 "start_new_session=True)")
    done = checked(sys.executable, "-c", lingering, grace=30)
    assert done.returncode == 0 and done.stderr == ""


@linux_only
def test_a_command_killed_by_a_signal_is_reported_as_a_shell_does():
    done = checked(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert done.returncode == 128 + 15


@linux_only
def test_no_command_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "tests.leftover_processes", "--"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "no command given" in done.stderr
