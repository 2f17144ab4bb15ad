"""bench/suite_cpu.py: a command's CPU time by kind of process, its exit status passed on."""

from __future__ import annotations

import subprocess
import sys

from bench import suite_cpu
from tests.conftest import REPO
from tests.workflow import snakemake_cli

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_a_busy_child_is_counted_under_its_kind_and_its_exit_status_passed_on(tmp_path):
    """A Python child that burns one CPU second, then exits 3: about one second under
    "other Python" (readings every half second lose at most that much; its interpreter's
    start adds a tenth or so), status 3."""
    script = BUSY.format(s=1.0) + "raise SystemExit(3)\n"
    out = tmp_path / "table.tsv"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench/suite_cpu.py"), "--out", str(out), "--",
         sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    rows = {
        name: float(cpu) for cpu, _, name in (r.split("\t") for r in out.read_text().splitlines())
    }
    assert 0.5 <= rows["other Python"] <= 1.6, rows


def test_the_kinds_follow_the_command_line():
    worker = "python -u -c import sys;exec(eval(sys.stdin.readline()))"
    assert suite_cpu.kind(worker, "python") == "pytest workers (tests in process)"
    assert suite_cpu.kind(
        "/v/bin/python /r/tests/workflow/job_server.py s.sock /r/chord 3", "p"
    ) == ("job server and its forked jobs")
    assert suite_cpu.kind("python /w/.snakemake/scripts/tmpab12.train.py", "python") == (
        "job scripts in a fresh interpreter"
    )
    assert suite_cpu.kind("", "kdamond.0") == "kernel: kdamond.0"
    # the tests' Snakemake server, whose program names the job wrapper it hands to its runs
    server = f"python -c {snakemake_cli.SERVER}"
    assert "job_python.py" in server
    assert suite_cpu.kind(server, "python") == "Snakemake fork server and its runs"
