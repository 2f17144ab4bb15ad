"""The Python of the workflow tests' Snakemake jobs: ``python script.py`` without paying the
script's third-party imports in every job.

A workflow test's Snakemake (tests/workflow/snakemake_cli.py) runs each ``script:`` job as
``<sys.executable> script.py``; there ``sys.executable`` is the wrapper :func:`install` writes,
which runs this file (stdlib only, ``-I -S``). It hands the job to a server
(tests/workflow/job_server.py) that made the imports once, for the job's environment (one
server per environment; PYTHONPATH, the package's own variables and :data:`PER_PROCESS` aside:
the package is imported by the job, from its own path), and forks the job from there: the
job's stdin, stdout and stderr are this process's, its signals (SIGINT, SIGTERM, ...) are
passed on, its exit status or signal is this process's.
Anything but a script (``-m``, ``-c``, flags) and any job before its environment's server
listens runs the real interpreter (exec). The first such job starts the server in the
background.

What differs from a fresh interpreter: the third-party modules were imported before the job's
folder and environment were set (the environment is the same: it keys the server), their
import-time warnings went to the server's log, and Snakemake's benchmark files measure this
process, not the job. The jobs on the Slurm test cluster run in fresh interpreters (there the
demo's every rule does: tests/slurm/test_demo.py); the Slurm tests' local reference runs use
this file too. tests/workflow/test_job_python.py checks the above.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

#: set per process or per test, read by nothing the server imports: left out of the key
PER_PROCESS = ("PWD", "OLDPWD", "_", "SHLVL", "PYTEST_CURRENT_TEST")
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)  # fmt: skip


def start_server(conf: dict, key: str, env: dict) -> None:
    """The environment's server, in the background, unless one holds its lock (starting or
    listening): the lock is the server's for its life."""
    lock = os.open(os.path.join(conf["folder"], f"{key}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return
    env = {k: v for k, v in env.items() if k != "PYTHONPATH" and not k.startswith(conf["prefix"])}
    with open(os.path.join(conf["folder"], f"{key}.log"), "ab") as log:
        server = subprocess.Popen(
            [conf["python"], conf["server"], socket_path(conf, key), conf["package"], str(lock)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(lock,),
            start_new_session=True,
            cwd=conf["folder"],
        )
    with open(os.path.join(conf["folder"], f"{key}.pid"), "w") as f:
        f.write(str(server.pid))
    os.close(lock)


def socket_path(conf: dict, key: str) -> str:
    return os.path.join(conf["folder"], f"{key}.sock")


class Forward:
    """The caller's signals, passed on to the job once its pid is known (those before: then)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        for sig in PASSED_ON:
            signal.signal(sig, self.handle)

    def handle(self, signum, frame) -> None:
        if self.pid is None:
            self.pending.append(signum)
            return
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:  # the job has ended: its status is on its way
            pass

    def start(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            self.handle(signum, None)

    def undo(self) -> None:
        """Back to the defaults (the real interpreter runs the job), the pending signals raised."""
        for sig in PASSED_ON:
            signal.signal(sig, signal.SIG_DFL)
        for signum in self.pending:
            os.kill(os.getpid(), signum)


def run_on_server(conf: dict, key: str, args: list[str], forward: Forward) -> int | None:
    """The job's exit status, or None where no server took it (nothing of it ran)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path(conf, key))
        request = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)})
        data = request.encode()
        socket.send_fds(conn, [len(data).to_bytes(8, "big")], [0, 1, 2])
        conn.sendall(data)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(64)
            if not chunk:
                return None  # the server went idle before forking the job
            reply += chunk
    except OSError:
        return None
    forward.start(int(reply))
    answer = b""
    while chunk := conn.recv(4096):
        answer += chunk
    if not answer:
        print(f"job_python: the waiter of job {forward.pid} ended first", file=sys.stderr)
        return 1
    status = json.loads(answer)["status"]
    if os.WIFSIGNALED(status):  # end as the job ended: by its signal
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)


def install(folder: Path, *, package: Path, prefix: str) -> Path:
    """Make ``folder`` (empty or new) the home of a wrapper, returned, that runs ``python``
    through this file for jobs of ``package`` (whose third-party imports the servers make;
    variables named ``prefix``... are the package's own, read by nothing the servers import)."""
    folder.mkdir(exist_ok=True)
    here = Path(__file__).parent
    conf = {"python": sys.executable, "server": str(here / "job_server.py"),
            "package": str(package), "prefix": prefix}  # fmt: skip
    (folder / "server.json").write_text(json.dumps(conf))
    wrapper = folder / "python"
    argv = (sys.executable, "-I", "-S", str(here / "job_python.py"), str(folder))
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.join(argv)} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def stop_servers(folder: Path) -> None:
    """Stop the servers of ``folder`` and remove it."""
    for pid in folder.glob("*.pid"):
        try:
            os.kill(int(pid.read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    folder, args = sys.argv[1], sys.argv[2:]
    with open(os.path.join(folder, "server.json")) as f:
        conf = {**json.load(f), "folder": folder}
    if args and args[0].endswith(".py") and not args[0].startswith("-"):  # python script.py ...
        # PYTHONPATH and the package's own variables: read by nothing the server imports
        env = {k: v for k, v in os.environ.items() if k not in PER_PROCESS
               and k != "PYTHONPATH" and not k.startswith(conf["prefix"])}  # fmt: skip
        key = hashlib.sha256(json.dumps(sorted(env.items())).encode()).hexdigest()[:20]
        forward = Forward()
        code = run_on_server(conf, key, args, forward)
        if code is not None:
            sys.exit(code)
        forward.undo()
        start_server(conf, key, dict(os.environ))
    os.execv(conf["python"], [conf["python"], *args])


if __name__ == "__main__":
    main()
