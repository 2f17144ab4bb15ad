"""tests/workflow/job_python.py, the workflow tests' Python for the jobs' scripts: a script run
through it behaves as under ``python script.py`` (its output, exit status, exception, argv,
folder, environment, sys.path, signals), whether the job is forked from a server or, before the
server listens, run by the real interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.workflow import job_python


@pytest.fixture
def jobs(tmp_path):
    """A wrapper whose servers preload the imports of a one-module package (``decimal``), and
    the environment of the jobs below (PYTHONPATH: a folder with the module ``on_path``)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text("import decimal\n")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "on_path.py").write_text("VALUE = 'from PYTHONPATH'\n")
    (tmp_path / "work").mkdir()
    wrapper = job_python.install(tmp_path / "jobs", package=package, prefix="PKG_")
    env = {**os.environ, "PYTHONPATH": str(lib), "JOB_VALUE": "x"}
    yield wrapper, tmp_path, env
    job_python.stop_servers(tmp_path / "jobs")


def call(wrapper, script: Path, *args: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(wrapper), str(script), *args], cwd=script.parent / "work",
                          env=env, capture_output=True, text=True, **kw)  # fmt: skip


def served(tmp: Path, count: int = 1) -> None:
    """Wait until ``count`` servers listen."""
    deadline = time.monotonic() + 60
    while len(list((tmp / "jobs").glob("*.sock"))) < count:
        assert time.monotonic() < deadline, "no server listens"
        time.sleep(0.05)


def script(tmp: Path, name: str, text: str) -> Path:
    """A script that first says on stderr whether the server's import was made."""
    path = tmp / name
    marker = (
        "import sys\nprint('decimal' in sys.modules and 'preloaded' or 'fresh', file=sys.stderr)\n"
    )
    path.write_text(marker + text)
    return path


REPORT = """
import os
import on_path
print(__name__, sys.argv[1:], os.getcwd(), os.environ.get("JOB_VALUE"))
print([p for p in sys.path if p.startswith(sys.argv[2])], on_path.VALUE)
sys.exit(int(sys.argv[1]))
"""


def test_a_script_runs_on_the_server_as_under_a_fresh_python(jobs):
    wrapper, tmp, env = jobs
    report = script(tmp, "report.py", REPORT)
    first = call(wrapper, report, "7", str(tmp), env=env)  # no server yet: the real interpreter
    assert first.stderr == "fresh\n"
    served(tmp)
    second = call(wrapper, report, "7", str(tmp), env=env)
    assert second.stderr == "preloaded\n"
    assert second.returncode == first.returncode == 7
    assert second.stdout == first.stdout
    assert first.stdout.splitlines() == [
        f"__main__ ['7', '{tmp}'] {tmp / 'work'} x",
        f"[{str(tmp)!r}, {str(tmp / 'lib')!r}] from PYTHONPATH",  # script's folder, PYTHONPATH
    ]
    # PYTHONPATH and the prefixed variables are the job's own, not the server's: one server
    moved = {**env, "PKG_X": "1", "PYTHONPATH": f"{tmp}/none:{tmp / 'lib'}"}
    other = call(wrapper, report, "0", str(tmp), env=moved)
    assert (other.stderr, other.returncode) == ("preloaded\n", 0)
    assert len(list((tmp / "jobs").glob("*.sock"))) == 1
    # another environment, another server (until it listens, the real interpreter)
    assert call(wrapper, report, "0", str(tmp), env={**env, "OTHER": "1"}).stderr == "fresh\n"
    served(tmp, 2)


def test_an_exception_ends_the_job_as_python_would(jobs):
    wrapper, tmp, env = jobs
    raises = script(tmp, "raises.py", "raise ValueError('bad input')\n")
    fresh = call(wrapper, raises, env=env)
    served(tmp)
    again = call(wrapper, raises, env=env)
    assert (fresh.stderr.splitlines()[0], again.stderr.splitlines()[0]) == ("fresh", "preloaded")
    assert again.returncode == fresh.returncode == 1
    last = "ValueError: bad input"
    assert again.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == last
    assert "Traceback" in again.stderr


HANDLER = """
import signal, time
def stop(signum, frame):
    print("stopped by", signal.Signals(signum).name, flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_signals_reach_the_job_and_the_jobs_end_is_the_callers(jobs):
    wrapper, tmp, env = jobs
    call(wrapper, script(tmp, "start.py", ""), env=env)
    served(tmp)
    handler = script(tmp, "handler.py", HANDLER)
    job = subprocess.Popen([str(wrapper), str(handler)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert job.stdout.readline() == "ready\n"
    job.send_signal(signal.SIGTERM)  # the job's handler runs; its exit status is the caller's
    out, err = job.communicate(timeout=30)
    assert (out, err, job.returncode) == ("stopped by SIGTERM\n", "preloaded\n", 3)
    # a job ended by a signal ends its caller by that signal
    killed = script(tmp, "killed.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert call(wrapper, killed, env=env).returncode == -signal.SIGKILL
    # the caller killed: the job goes too
    sleeper = script(tmp, "sleeper.py", "import os, time\nprint(os.getpid(), flush=True)\n"
                     "time.sleep(60)\n")  # fmt: skip
    job = subprocess.Popen([str(wrapper), str(sleeper)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    pid = int(job.stdout.readline())
    assert pid != job.pid  # forked by the server
    job.kill()
    job.wait()
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, "the job outlived its caller"
        time.sleep(0.05)


def test_what_is_not_a_script_runs_the_real_interpreter(jobs):
    wrapper, _, env = jobs
    proc = subprocess.run([str(wrapper), "-c", "import sys; print(sys.flags.isolated)"],
                          env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert proc.stdout == "0\n"  # not the wrapper's own -I


def test_stopping_the_servers_ends_them_and_removes_their_folder(jobs):
    wrapper, tmp, env = jobs
    call(wrapper, script(tmp, "start.py", ""), env=env)
    served(tmp)
    (pid_file,) = (tmp / "jobs").glob("*.pid")
    pid = int(pid_file.read_text())
    assert alive(pid)
    job_python.stop_servers(tmp / "jobs")
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, "the server outlived stop_servers"
        time.sleep(0.05)
    assert not (tmp / "jobs").exists()
