"""Snakemake's command line for the tests, without paying its imports on every invocation.

The slow tier runs Snakemake's CLI a few hundred times, mostly dry runs of a few seconds, of
which importing Snakemake is about half. :func:`run` hands each invocation to a server process
that imported ``snakemake.cli`` once and forks a child per invocation: the child takes the
invocation's working folder, environment and PYTHONPATH (first on sys.path after the working
folder, as ``python -m snakemake`` puts them), its stdout and stderr go to files, and it runs
``snakemake.cli.main`` with the arguments; its exit status is the invocation's. The server
imports nothing of chord (each Snakefile imports its own copy in the child), and the jobs a
child starts are processes of their own, as under ``python -m snakemake``. A test whose point
is Snakemake's own interpreter (tests/workflow/test_dag_build.py) starts it itself.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests.conftest import REPO
from tests.workflow import job_python

# The server: one JSON request a line on stdin ({args, cwd, env, stdout, stderr}), one reply
# ({"rc": status}) a line on stdout, after the forked child has exited.
SERVER = r"""
import importlib, json, os, sys, traceback
import snakemake.cli

# what every invocation loads after parsing its arguments: the plugin registries (their
# plugins found and imported) and the modules of the DAG build and the scheduler
for registry in (
    snakemake.cli.ExecutorPluginRegistry,
    snakemake.cli.StoragePluginRegistry,
    snakemake.cli.ReportPluginRegistry,
    snakemake.cli.LoggerPluginRegistry,
    snakemake.cli.SchedulerPluginRegistry,
):
    registry()
for name in ("snakemake.dag", "snakemake.persistence", "snakemake.scheduling.job_scheduler", "yte"):
    importlib.import_module(name)

def child(req):
    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[1:1] = extra  # after '' (the working folder), as python -m does
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            out = os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
        sys.argv = ["snakemake", *req["args"]]
        if req["python"]:  # the jobs' scripts run through tests/workflow/job_python.py
            sys.executable = req["python"]
        try:
            snakemake.cli.main(req["args"])
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""

# Idle servers: a call takes one (or starts one) and gives it back, so calls from threads
# side by side (tests/stages/test_bad_input.py) each have their own.
_idle: list[subprocess.Popen] = []
_lock = threading.Lock()


def _start() -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    atexit.register(server.stdin.close)  # its loop ends, and with it the server
    return server


_jobs_folder: Path | None = None


def job_interpreter() -> str:
    """The interpreter the jobs' scripts run with (tests/workflow/job_python.py): a wrapper made
    once per test process, in a folder of its own that also holds the job servers' sockets."""
    global _jobs_folder
    with _lock:
        if _jobs_folder is None:
            folder = Path(tempfile.mkdtemp(prefix="chord-job-python-"))
            job_python.install(folder, package=REPO / "chord", prefix="CHORD_")
            atexit.register(job_python.stop_servers, folder)
            _jobs_folder = folder
    return str(_jobs_folder / "python")


def run(
    args: list[str], *, cwd: Path | str, env: dict[str, str], fresh_jobs: bool = False
) -> subprocess.CompletedProcess:
    """``python -m snakemake *args`` in ``cwd`` with the environment ``env``, as a
    CompletedProcess with its text output (forked from a server: module docstring). Its jobs'
    scripts run through :func:`job_interpreter`, or, with ``fresh_jobs`` (or CHORD_TEST_FRESH_JOBS=1
    in the tests' environment, to tell a job's failure from the server's), each in a fresh
    interpreter."""
    fresh_jobs = fresh_jobs or os.environ.get("CHORD_TEST_FRESH_JOBS") == "1"
    with _lock:
        while _idle and _idle[-1].poll() is not None:
            _idle.pop()
        server = _idle.pop() if _idle else None
    server = server or _start()
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        request = {"args": [str(a) for a in args], "cwd": str(cwd), "env": dict(env),
                   "python": None if fresh_jobs else job_interpreter()}  # fmt: skip
        server.stdin.write(json.dumps({**request, "stdout": str(out), "stderr": str(err)}) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        if not reply:
            raise RuntimeError(f"the Snakemake server exited ({server.wait()})")
        code = json.loads(reply)["rc"]
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    with _lock:
        _idle.append(server)
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "snakemake", *args], code, stdout, stderr
    )
