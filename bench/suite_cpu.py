"""Where a command's CPU time goes, by kind of process: run it (the test suite, say) while
reading every process's CPU time from /proc twice a second, then print the seconds each kind
used, the whole machine's busy share and what the kernel and other programs took meanwhile.

    python bench/suite_cpu.py [--out table.tsv] -- python -m pytest [args]

A process is counted under the first kind whose pattern its command line matches (KINDS);
a forked child keeps its parent's command line, so the job server's forked jobs count as the
server, and the forked Snakemake runs as the Snakemake fork server. Processes that end
between two readings lose at most half a second each. Linux only (/proc). Not collected by
pytest; the figures are in docs/development.md ("The suite's time").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

#: (kind, pattern searched in the command line), first match wins: the Snakemake fork server's
#: program (tests/workflow/snakemake_cli.py) names job_python.py, so it comes first
KINDS = [
    ("pytest workers (tests in process)", r"exec\(eval\(sys\.stdin"),
    ("Snakemake fork server and its runs", r"-c\s+import importlib, json, os, sys"),
    ("job server and its forked jobs", r"job_server\.py"),
    ("job_python wrappers", r"job_python\.py"),
    ("job scripts in a fresh interpreter", r"\.snakemake/scripts/"),
    ("Snakemake on Slurm: submitting", r"snakemake_main"),
    ("Snakemake on Slurm: job steps", r"-m snakemake|bin/snakemake"),
    ("Chromium", r"chromium"),
    ("chord CLI and checks", r"-m chord\.|chord\.cli"),
    ("torchrun", r"torch\.distributed\.run"),
    ("other Python", r"python"),
    ("Node.js", r"\bnode\b|esbuild"),
    ("ffmpeg", r"ffmpeg"),
    ("Slurm, munge, MariaDB daemons", r"slurm|munge|mariadb"),
]


def kind(cmd: str, comm: str) -> str:
    for name, pattern in KINDS:
        if re.search(pattern, cmd):
            return name
    return f"kernel: {comm}" if not cmd else f"other: {comm}"


def read_all(me: int, tick: int, seen: dict) -> None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick
            key = (int(entry), fields[19])  # pid and start time: a reused pid is another
            if key not in seen:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                seen[key] = [0.0, kind(cmd.decode(errors="replace").strip(), comm), cpu]
            seen[key][0] = cpu - seen[key][2]  # CPU since the first reading
        except (OSError, ValueError, IndexError):
            pass  # ended meanwhile


def machine_busy() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values), values[3] + values[4]  # all, idle + iowait


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="also write the table as TSV")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command: give it after --")
    tick, me, seen = os.sysconf("SC_CLK_TCK"), os.getpid(), {}
    read_all(me, tick, seen)
    for value in seen.values():  # what ran before the command is counted from now
        value[0] = 0.0
    start, (all0, idle0) = time.monotonic(), machine_busy()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        read_all(me, tick, seen)
        time.sleep(0.5)
    wall, (all1, idle1) = time.monotonic() - start, machine_busy()
    by_kind, count = Counter(), Counter()
    for cpu, name, _ in seen.values():
        if cpu > 0:
            by_kind[name] += cpu
            count[name] += 1
    total = sum(by_kind.values())
    busy = 1 - (idle1 - idle0) / max(all1 - all0, 1)
    rows = [(v, count[k], k) for k, v in by_kind.most_common()]
    print(f"\n{wall:.0f} s wall, {os.cpu_count()} CPUs {busy:.0%} busy; {total:.0f} CPU s:")
    for cpu, n, name in rows:
        if cpu >= 1:
            print(f"{cpu:8.0f} s {cpu / total:5.1%} {n:6d}  {name}")
    if args.out:
        args.out.write_text("".join(f"{c:.1f}\t{n}\t{k}\n" for c, n, k in rows))
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
