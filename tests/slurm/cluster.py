"""A real single-node Slurm cluster for the tests: munged, MariaDB + slurmdbd (so ``sacct``
answers from accounting, as on a real site), slurmctld and slurmd, all run from a temporary
folder and stopped again by the PIDs this class started.

The node is this machine (``slurmd -C``) with fake GPUs of two kinds, one ``big`` and two
``small``: gres entries on character-device symlinks (Slurm rejects plain files and drains a
node with a GPU count but no ``File=``), so a test can see which GPU kind a job asked for.
No cgroups are needed (``task/none``, ``proctrack/linuxproc``). The settings follow what was
measured running a real single-node Slurm on a machine like CI's (the team's SLURM notes).

Needs root (slurmd runs jobs as their user and munged runs as user ``munge``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# The node's fake GPUs, gpu0, gpu1, ...: (Slurm GPU type, the character device its gres file
# links to). One big, two small: the workflow's leaner tiers share the small kind.
GPUS = (("big", "/dev/null"), ("small", "/dev/zero"), ("small", "/dev/full"))
GPU_KINDS = tuple(dict.fromkeys(kind for kind, _ in GPUS))
CLUSTER_NAME = "chordci"
ACCOUNT = "ci"
PARTITION = "debug"
# Where every Slurm client finds its configuration when SLURM_CONF is unset: the jobstep
# executor clears all SLURM_* variables before its srun, so the config must be here too.
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
# Our temporary folders' prefix: a /etc/slurm/slurm.conf symlink into one is ours.
PREFIX = "chord-slurm-"
DAEMONS = ("slurmctld", "slurmd", "munged")
ACCOUNTING = ("slurmdbd", "mariadbd", "mariadb-install-db", "sacctmgr")
# Seconds a requeued job is held before it may run again (Slurm's AuthInfo cred_expire).
CRED_EXPIRE_S = 15


class ClusterError(RuntimeError):
    pass


def missing_commands(accounting: bool = True) -> list[str]:
    """The Slurm, munge (and accounting) programs not on PATH."""
    needed = (*DAEMONS, "sbatch", "sinfo", "scontrol", "sacct", "setpriv")
    needed += ACCOUNTING if accounting else ()
    return [c for c in needed if shutil.which(c) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_line() -> tuple[str, str]:
    """(node name, hardware part of its NodeName line) from ``slurmd -C``."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    first = out.splitlines()[0].split()
    fields = dict(f.split("=", 1) for f in first)
    return fields["NodeName"], " ".join(f for f in first if not f.startswith("NodeName="))


def _alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


class Cluster:
    """``with Cluster() as c:`` starts the daemons and waits until the node is idle; leaving the
    block cancels the remaining jobs and stops the daemons. ``c.env`` is an environment whose
    Slurm commands talk to this cluster."""

    def __init__(self, root: Path | None = None, accounting: bool = True, start_timeout=60.0):
        self.accounting = accounting
        self.start_timeout = start_timeout
        self.root = Path(root or tempfile.mkdtemp(prefix=PREFIX))
        self.root.chmod(0o755)  # munged (user munge) must reach its folder below
        self.conf = self.root / "etc/slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.linked = False
        self.node, self._hardware = node_line()
        self.start_seconds = None
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ----------------------------------------------------------------- configuration
    def write_config(self) -> None:
        r = self.root
        for sub in ("etc", "state", "spool", "log", "run", "dev", "munge"):
            (r / sub).mkdir(exist_ok=True)
        munge = r / "munge"
        shutil.chown(munge, "munge", "munge")
        munge.chmod(0o755)  # munged wants its socket folder searchable by all, writable by it
        self.munge_socket = munge / "munge.socket"
        self.ports = {k: free_port() for k in ("ctld", "slurmd", "dbd", "db")}
        gres_lines = ["AutoDetect=off"]
        for i, (kind, device) in enumerate(GPUS):
            link = r / "dev" / f"gpu{i}"
            link.unlink(missing_ok=True)
            link.symlink_to(device)
            gres_lines.append(f"NodeName={self.node} Name=gpu Type={kind} File={link}")
        (r / "etc/gres.conf").write_text("\n".join(gres_lines) + "\n")
        counts = {kind: sum(k == kind for k, _ in GPUS) for kind in GPU_KINDS}
        gres = ",".join(f"gpu:{kind}:{n}" for kind, n in counts.items())
        tres = ",".join(["gres/gpu", *(f"gres/gpu:{kind}" for kind in GPU_KINDS)])
        if self.accounting:
            accounting = [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.ports['dbd']}",
                # with slurmdbd this names the munge socket of accounting connections (AuthInfo
                # covers only the others)
                f"AccountingStoragePass={self.munge_socket}",
                f"AccountingStorageTRES={tres}",
                "AccountingStoreFlags=job_comment",
            ]
        else:
            accounting = ["AccountingStorageType=accounting_storage/none"]
        lines = [
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # a requeued job waits cred_expire seconds before it may start again (default
            # 120): a training that requeues itself at its time limit continues sooner
            f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE_S}",
            f"SlurmctldPort={self.ports['ctld']}",
            f"SlurmdPort={self.ports['slurmd']}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run/slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run/slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log/slurmctld.log'}",
            f"SlurmdLogFile={r / 'log/slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # no cgroups: tasks are tracked by their parent PIDs
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            # memory is scheduled, as on a real site: a job asking more than the node has
            # is rejected at submission
            "SelectTypeParameters=CR_Core_Memory",
            "ReturnToService=2",
            # jobs are not requeued unless submitted with --requeue (the profile's
            # slurm-requeue), as on sites that preempt
            "JobRequeue=0",
            # finished jobs stay visible to squeue/scontrol this long (the executor's squeue
            # status needs >= 3x its first status-check delay)
            "MinJobAge=300",
            # SIGTERM -> SIGKILL grace of a cancelled or requeued job (the training's SIGTERM
            # checkpoint needs one iteration)
            "KillWait=15",
            # the backfill scheduler every second: a job waiting for the other GPU kind does
            # not hold back the ones behind it for long; the main one every 5 s (not 60): a
            # requeued job starts soon after its cred_expire
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1,sched_interval=5",
            "GresTypes=gpu",
            # a job without --mem (the tests' own sbatch calls) takes 500 MB, not the node
            "DefMemPerCPU=500",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            *accounting,
            f"NodeName={self.node} NodeAddr=127.0.0.1 {self._hardware} Gres={gres} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        if self.accounting:
            dbd = self.root / "etc/slurmdbd.conf"
            dbd.write_text(
                "\n".join(
                    [
                        "AuthType=auth/munge",
                        f"AuthInfo=socket={self.munge_socket}",
                        "DbdHost=localhost",
                        "DbdAddr=127.0.0.1",
                        f"DbdPort={self.ports['dbd']}",
                        "SlurmUser=root",
                        f"PidFile={r / 'run/slurmdbd.pid'}",
                        f"LogFile={r / 'log/slurmdbd.log'}",
                        "StorageType=accounting_storage/mysql",
                        "StorageHost=127.0.0.1",
                        f"StoragePort={self.ports['db']}",
                        "StorageUser=root",
                        "StorageLoc=slurm_acct_db",
                    ]
                )
                + "\n"
            )
            dbd.chmod(0o600)  # slurmdbd refuses a readable config (it may hold a password)

    def link_system_conf(self) -> None:
        """/etc/slurm/slurm.conf -> our config, if absent or a leftover of an earlier test
        cluster; a live one of another session, or a site's own file, is left alone."""
        if SYSTEM_CONF.is_symlink():
            target = Path(os.readlink(SYSTEM_CONF))
            if PREFIX not in str(target):
                raise ClusterError(f"{SYSTEM_CONF} links to {target}, not a test cluster's")
            if _alive(target.parent.parent / "run/slurmctld.pid"):
                raise ClusterError(
                    f"{SYSTEM_CONF} links to {target}: another test cluster is running"
                )
            SYSTEM_CONF.unlink()  # left by a test session that was killed
        elif SYSTEM_CONF.exists():
            raise ClusterError(f"{SYSTEM_CONF} exists (a real Slurm config); not replacing it")
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.symlink_to(self.conf)
        self.linked = True

    # ----------------------------------------------------------------- daemons
    def spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        # own session: a Ctrl-C or a signal to the test's process group does not reach them
        self.procs[name] = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        log.close()

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace").strip().splitlines()[-25:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def wait_for(self, what: str, ok, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited with {proc.returncode} while waiting for {what}\n"
                        + self.logs()
                    )
            if ok():
                return
            time.sleep(0.2)
        raise ClusterError(f"timed out waiting for {what}\n" + self.logs())

    def quiet(self, *cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env)

    def start_accounting(self) -> None:
        data = self.root / "mysql"
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            check=True,
        )
        self.spawn(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                f"--port={self.ports['db']}",
                "--bind-address=127.0.0.1",
                f"--socket={self.root / 'run/mysql.sock'}",
                f"--pid-file={self.root / 'run/mysql.pid'}",
                "--skip-grant-tables",  # a throwaway database: no users, no passwords
                "--skip-log-bin",
                "--innodb-buffer-pool-size=64M",
            ],
        )

        def db_up():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.ports["db"])) == 0

        self.wait_for("mariadbd", db_up)
        # slurmdbd reads slurmdbd.conf beside SLURM_CONF's slurm.conf
        self.spawn("slurmdbd", ["slurmdbd", "-D"])
        self.wait_for("slurmdbd", self.dbd_up)
        for args in (
            ("add", "cluster", CLUSTER_NAME),
            ("add", "account", ACCOUNT, f"cluster={CLUSTER_NAME}"),
            ("add", "user", "root", f"account={ACCOUNT}", f"cluster={CLUSTER_NAME}"),
        ):
            proc = self.quiet("sacctmgr", "-i", *args)
            if proc.returncode != 0:
                raise ClusterError(f"sacctmgr {' '.join(args)}: {proc.stderr}\n" + self.logs())

    def dbd_up(self) -> bool:
        return self.quiet("sacctmgr", "-n", "list", "cluster").returncode == 0

    def start(self) -> Cluster:
        t0 = time.monotonic()
        self.write_config()
        self.link_system_conf()
        try:
            self.spawn(
                "munged",
                [
                    "setpriv",
                    "--reuid=munge",
                    "--regid=munge",
                    "--clear-groups",
                    "munged",
                    "-F",
                    f"--socket={self.munge_socket}",
                    f"--pid-file={self.root / 'munge/munged.pid'}",
                    f"--log-file={self.root / 'munge/munged.log'}",
                    f"--seed-file={self.root / 'munge/munged.seed'}",
                ],
            )
            self.wait_for("munged", self.munge_socket.exists)
            if self.accounting:
                self.start_accounting()
            self.spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
            self.wait_for("slurmctld", lambda: self.quiet("scontrol", "ping").returncode == 0)
            self.spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
            self.wait_for("the node to be idle", self.node_idle)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def node_idle(self) -> bool:
        proc = self.quiet("sinfo", "-h", "-N", "-o", "%T")
        return proc.returncode == 0 and proc.stdout.split() == ["idle"]

    def cancel_all(self, timeout: float = 20) -> None:
        """Cancel every job (suspended ones too) and wait up to ``timeout`` s for the queue to
        empty: a test that fails half-way leaves the node free for the next."""
        self.quiet("scancel", "--full", f"--clusters={CLUSTER_NAME}", "--user=root")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.quiet("squeue", "-h").stdout.strip():
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel what still runs, stop the daemons this object started (newest first), remove
        the /etc/slurm/slurm.conf link it made and its folder."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.cancel_all()
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
        if self.linked and SYSTEM_CONF.is_symlink():
            SYSTEM_CONF.unlink()
            self.linked = False
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----------------------------------------------------------------- queries
    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = self.quiet(*cmd)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)}: {proc.stdout}{proc.stderr}")
        return proc

    def sacct(self, *fields: str, duplicates: bool = False) -> list[dict]:
        """Accounting records of this cluster's jobs (allocations, not steps), memory in MB:
        one dict per job, or with ``duplicates`` one per run of a requeued job."""
        proc = self.run(
            "sacct",
            "-X",
            "-n",
            "--parsable2",
            "--allusers",
            "--units=M",
            "--starttime=now-1days",
            *(["--duplicates"] if duplicates else []),
            f"--format={','.join(fields)}",
        )
        return [
            dict(zip(fields, line.split("|"), strict=True)) for line in proc.stdout.splitlines()
        ]
