"""Real GPUs as test data: the nodes of tests/data/gpu_cards.tsv (what nvidia-smi reports for
each card) and a fake ``nvidia-smi`` that answers for a node the way the real one does, so the
code that asks it (the DAG build, ``chord doctor``) runs unchanged on a machine without GPUs."""

from __future__ import annotations

import csv
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests import components

CARDS_TSV = Path(__file__).parent / "data" / "gpu_cards.tsv"


@dataclass(frozen=True)
class NodeRow:
    node: str
    gpus: int
    name: str
    memory_total_mib: int
    compute_cap: str
    shipped: str  # the tier a user expects with config/config.yaml's tiers
    multi: str  # ... with the README's multi-GPU tiers added


def nodes() -> list[NodeRow]:
    """The file's nodes; read as a test module is collected, which skips, naming the file,
    where it is missing (a partial copy of the repository)."""
    if not CARDS_TSV.is_file():
        components.missing(components.TEST_DATA, f"{CARDS_TSV} is missing", module=True)
    with open(CARDS_TSV) as f:
        lines = [line for line in f if not line.startswith("#")]
    rows = csv.DictReader(lines, delimiter="\t")
    return [
        NodeRow(
            r["node"],
            int(r["gpus"]),
            r["name"],
            int(r["memory_total_mib"]),
            r["compute_cap"],
            r["shipped"],
            r["multi"],
        )
        for r in rows
    ]


# The fake: `-L` and `--query-gpu=<fields> --format=csv[,noheader][,nounits]` as nvidia-smi
# prints them (a field it does not know is an error with exit status 2, as the real one's is).
_SCRIPT = """\
#!{python}
import json, sys
GPUS = json.loads({gpus!r})
args = sys.argv[1:]
if args == ["-L"]:
    for i, g in enumerate(GPUS):
        print(f"GPU {{i}}: {{g['name']}} (UUID: {{g['uuid']}})")
    sys.exit(0)
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "")
if query is None or not fmt.startswith("csv"):
    print("fake nvidia-smi: only -L and --query-gpu=... --format=csv", file=sys.stderr)
    sys.exit(2)
units = {{"memory.total": " MiB"}}
fields = query.split(",")
for f in fields:
    if f not in ("index", "uuid", "name", "memory.total", "compute_cap"):
        print(f'Field "{{f}}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
if "noheader" not in fmt:
    print(", ".join(f + (" [MiB]" if f in units and "nounits" not in fmt else "") for f in fields))
for i, g in enumerate(GPUS):
    values = {{"index": str(i), "uuid": g["uuid"], "name": g["name"],
              "memory.total": str(g["memory_total_mib"]), "compute_cap": g["compute_cap"]}}
    print(", ".join(values[f] + ("" if "nounits" in fmt else units.get(f, "")) for f in fields))
"""


def install_fake_nvidia_smi(folder: Path, row: NodeRow) -> Path:
    """Write an executable ``nvidia-smi`` for ``row``'s node into ``folder`` (put it first on
    PATH); returns the folder."""
    gpus = [
        {
            "name": row.name,
            "uuid": f"GPU-{row.node}-{i}",
            "memory_total_mib": row.memory_total_mib,
            "compute_cap": row.compute_cap,
        }
        for i in range(row.gpus)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text(textwrap.dedent(_SCRIPT).format(python=sys.executable, gpus=json.dumps(gpus)))
    exe.chmod(0o755)
    return folder
