"""``python job_server.py SOCKET PACKAGE``: a Snakemake job's interpreter with the third-party
imports of the package at PACKAGE already made, forking one process per job (the server side of
tests/workflow/job_python.py; its docstring says when the tests use it and what differs).

It imports, once, every module the package's sources import (at module level or inside a
function, ``from x import y`` names included, found with :mod:`ast`) except the package itself
and :data:`NOT_PRELOADED`, and what Snakemake's script preamble imports (:data:`PREAMBLE`),
then listens on SOCKET. Per connection a waiter process takes the job's stdin, stdout and
stderr (passed as descriptors), its argv, working folder and environment, forks the job and
reports its wait status when it ends (or kills it when the caller's end of the connection
closes first). The job process returns to this module's top level and runs the script as
``__main__``: an exception or ``sys.exit`` there ends it as it would end ``python script.py``.
The server exits after IDLE_S without a job.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

IDLE_S = 900
#: imports made only where they are safe: gsplat's CUDA backend compiles its kernels when
#: imported; mmgp.offload is imported through chord's arch-list shim (chord.guidance.mmgp)
NOT_PRELOADED = ("gsplat.cuda._backend", "mmgp")
#: what every job imports before its script's first line: Snakemake's preamble (the module that
#: writes it imports the classes the preamble and its pickled ``snakemake`` object name)
PREAMBLE = ("snakemake.script", ())


def imports_of(package: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every absolute import in the package's sources, not of itself."""
    found: dict[tuple[str, tuple[str, ...]], None] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                items = [(alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                items = [(node.module, tuple(a.name for a in node.names if a.name != "*"))]
            else:
                continue
            for module, names in items:
                top = module.split(".")[0]
                if top == package.name or module.startswith(NOT_PRELOADED):
                    continue
                found[(module, names)] = None
    return list(found)


def preload(package: Path) -> None:
    for module, names in [PREAMBLE, *imports_of(package)]:
        try:
            mod = importlib.import_module(module)
            for name in names:  # lazy attributes (transformers, diffusers) load their modules
                getattr(mod, name, None)
        except Exception as exc:  # an optional dependency absent here: the job finds out too
            print(f"not preloaded: {module} {names}: {type(exc).__name__}: {exc}", flush=True)


def receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size, data = int.from_bytes(head, "big"), b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the job's request ended early")
        data += chunk
    return json.loads(data), fds


def wait_for(conn: socket.socket, pid: int) -> int:
    """The job's wait status; SIGKILL to it if the caller goes first."""
    pidfd = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([conn, pidfd], [], [])
        if pidfd in ready:
            return os.waitpid(pid, 0)[1]
        if not conn.recv(1):  # the caller is gone
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]


def serve(listener: socket.socket, lock_fd: int) -> dict:
    """Accept jobs until idle; returns (only in a job's process) the job's request."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped by the kernel
    listener.settimeout(IDLE_S)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            sys.exit(0)
        conn.settimeout(None)
        if os.fork():
            conn.close()
            continue
        # the waiter
        listener.close()
        os.close(lock_fd)  # the server's alone (job_python.py: one server per environment)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        request, fds = receive(conn)
        pid = os.fork()
        if pid == 0:
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            return request
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        status = wait_for(conn, pid)
        try:
            conn.sendall(json.dumps({"status": status}).encode())
        finally:
            os._exit(0)


def become(request: dict, base_path: list[str], socket_path: str) -> str:
    """This process made the job's: folder, environment, argv, sys.path (the script's folder,
    then PYTHONPATH, as ``python script.py`` has it); returns the script."""
    import random
    import tempfile

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [str(Path(script).resolve().parent), *extra, *base_path]
    importlib.invalidate_caches()
    # what the job imports from source (the package, a lazy import) is compiled once for every
    # job of this server, in its folder, also where PYTHONDONTWRITEBYTECODE keeps a fresh
    # interpreter from writing bytecode (the development machine: 0.3-0.5 s a job)
    sys.pycache_prefix = str(Path(socket_path).with_suffix(".pycache"))
    sys.dont_write_bytecode = False
    tempfile.tempdir = None  # TMPDIR as the job has it
    random.seed()  # a fresh interpreter's seeds, not the server's
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    return script


if __name__ == "__main__":
    socket_path, package, lock_fd = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    base_path = sys.path[1:]  # without this file's folder
    sys.path[:] = base_path
    preload(package)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path + ".tmp")
    listener.listen(64)
    os.rename(socket_path + ".tmp", socket_path)  # callers connect once the imports are made
    try:
        job = serve(listener, lock_fd)
    except SystemExit:  # idle: callers start another
        os.unlink(socket_path)
        raise
    import runpy

    runpy.run_path(become(job, base_path, socket_path), run_name="__main__")
