"""``chord doctor --trace``: each tier's training iteration at the config's real shapes, run on
a faked ``cuda:0`` (:mod:`chord.checks.fake_iteration`, the experts built at the Wan folder's
shapes, A14B's when none is configured), its traced peak of device memory beside the memory
model's estimate and the card the tier runs on. It needs no GPU and no weights, so it runs on a
login node or a laptop before a job is submitted (minutes: about one per tier on two cores).

The faked device needs torch's CPU build and a fresh interpreter (the fake device is loaded
before torch is imported), so the trace runs as a child process; each distinct method among the
scenes (the config's, a preset's, a sheet row's overrides) is traced once, for its first scene.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GiB = 2**30


def methods(conf) -> dict[str, list[str]]:
    """The scenes that share a method, by the first of them, in sheet order."""
    groups: dict[str, list[str]] = {}
    firsts: list[tuple] = []  # (method, first scene)
    for name, spec in conf.scenes.items():
        first = next((f for m, f in firsts if m == spec.method), None)
        if first is None:
            firsts.append((spec.method, name))
            first = name
        groups.setdefault(first, []).append(name)
    return groups


def command(config: Path, configfiles, *, scene, wan, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "chord.checks.fake_iteration", "--experts", "a14b"]
    cmd += ["--config", str(config), "--json", str(out)]
    for extra in configfiles:
        cmd += ["--configfile", str(extra)]
    if scene is not None:
        cmd += ["--scene", scene]
    if wan:
        cmd += ["--wan", str(wan)]
    return cmd


def run(conf, config: Path, configfiles=(), *, echo=print) -> list[dict]:
    """The faked iteration's report per distinct method: ``{"scenes", "exit", "report" or
    "error"}``. Each tier's line is echoed as the child prints it (progress on a long trace)."""
    results = []
    for first, scenes in (methods(conf) or {None: []}).items():
        label = first if len(scenes) < 2 else f"{first} (+{len(scenes) - 1})"
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "trace.json"
            cmd = command(config, configfiles, scene=first, wan=conf.guidance.ckpt_dir, out=out)
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ
            )
            for line in proc.stdout:
                echo(f"  {label or 'method'}: {line.rstrip()}")
            err = proc.stderr.read()
            code = proc.wait()
            row = {"scenes": label or "method", "exit": code}
            if out.is_file():
                row["report"] = json.loads(out.read_text())
            else:
                lines = [ln for ln in err.strip().splitlines() if ln.strip()]
                row["error"] = lines[-1] if lines else f"exit {code}"
            results.append(row)
    return results


def card(tier) -> str:
    """The card a tier's jobs ask for: the profile's GPU model where it names one."""
    size = f"{tier.gpu_mem_gb:g} GB"
    return f"{tier.gpu_model} ({size})" if tier.gpu_model else f"a {size} GPU"


def table(results: list[dict], tier_table: dict, node=None) -> tuple[str, bool]:
    """The rows users read, and whether every tier's iteration ran and fits its card (and this
    node's GPU, where ``node`` knows one)."""
    head = ["scenes", "tier", "size", "traced peak", "model", "model/trace", "card", "fits"]
    rows, ok = [head], True
    for result in results:
        name = result["scenes"]
        if "report" not in result:
            rows.append([name, "-", "-", "-", "-", "-", "-", f"failed: {result['error']}"])
            ok = False
            continue
        for r in result["report"]["tiers"]:
            tier = tier_table[r["tier"]]
            if not r["ok"]:
                where = r["where"][-1] if r.get("where") else "?"
                rows.append([name, r["tier"], r["size"], "-", "-", "-", card(tier),
                             f"FAILED at {where}: {r['error'].splitlines()[0][:160]}"])  # fmt: skip
                ok = False
                continue
            peak, model = r["traced_peak_bytes"], r["model_peak_bytes"]
            budget = tier.gpu_mem_gb * 1e9
            fits = "yes" if peak <= budget else f"no ({peak / 1e9:.1f} GB > {budget / 1e9:g} GB)"
            if node is not None and peak > node.total_bytes:
                fits += f"; not on this node's {node.total_bytes / 1e9:.0f} GB"
            ok &= peak <= budget
            rows.append([name, r["tier"], f"{r['size']}x{r['frames']} b{r['batch']}",
                         f"{peak / GiB:.1f} GiB", f"{model / GiB:.1f} GiB",
                         f"{model / peak:.3f}", card(tier), fits])  # fmt: skip
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines), ok


def main(conf, config: Path, configfiles=()) -> bool:
    """``chord doctor --trace``: progress on stderr, the table on stdout; whether every tier's
    iteration ran and fits its card."""
    from chord.resources import gpus, tiers

    tier_table = tiers.parse(conf.tiers)
    print(
        f"chord doctor --trace: {len(methods(conf)) or 1} method(s) x {len(tier_table)} tier(s) "
        "on a faked cuda:0 (no GPU, no weights; about a minute per tier on two cores)",
        file=sys.stderr,
        flush=True,
    )
    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    results = run(conf, config, configfiles, echo=echo)
    node = gpus.node(os.environ, gpu_mem_gb=conf.gpu_mem_gb, gpus_per_node=conf.gpus_per_node)
    text, ok = table(results, tier_table, node)
    print(text)
    return ok
