"""Time Snakemake's dry run (DAG build and job planning) of the real workflow for many scenes,
side by side with a toy workflow of the same jobs.

    python bench/dag.py [--scenes 100 1000 3000] [--repeat 2]

Each size writes a scene sheet of N rows in a temporary folder; every row points at one of the
bundled demo scenes (many scenes may share a data folder) with its own id and prompt, so the
DAG has N independent scene chains with every stage (ingest to aggregate). It prints the jobs
planned and the best wall time and CPU time (user + system) of ``snakemake -n --quiet`` per N:
the whole command, Python start-up, parsing, schema validation and the DAG. Issue 8's budget is
8 s for 1000 scenes on the 2-core CI machine.

The toy workflow (:data:`TOY`) has the real rules' names, wildcards, output, log and benchmark
files, their ``conda:`` and ``script:`` directives (a one-line script that imports nothing) and
the same DAG (the scenes' objects and roles are read once, by this script, into a JSON plan),
but no package code: no config validation, no input functions beyond dict look-ups, no params,
no code-digest jobs or code inputs. ``real / toy`` is what the workflow's own Python costs on
top of Snakemake's per-job work; ``--bare-toy`` gives the toy ``shell: touch`` rules instead
(Snakemake's handling of ``script:`` and ``conda:`` then counts as the workflow's too).
``--toy`` picks one of :data:`TOYS` to measure what Snakemake itself spends on each of those
directives and on the real rules' ``report()`` outputs (``report``: the default toy with them).
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]  # the snakemake runs import this tree's chord

# The real rules' jobs and files (rules/*.smk); plan.json holds the DAG. "# ACTION" becomes
# the directives of a toy kind (TOYS: SCRIPT, the real rules' directives; SHELL, --bare-toy).
TOY = """
import json

PLAN = json.load(open("plan.json"))
SCENES = PLAN["scenes"]
DEMO_DIR = PLAN["demo_dir"]
R = "results"
VIEWS = ["front", "right", "back", "left"]


wildcard_constraints:
    scene=r"[A-Za-z0-9_-]+",
    obj=r"obj_\\d+",


def kept(scene):
    return [o for o, role in SCENES[scene]["roles"].items() if role != "avoided"]


def dynamic(scene):
    return [o for o, role in SCENES[scene]["roles"].items() if role == "dynamic"]


def ingest_inputs(wc):
    return {"data": SCENES[wc.scene]["glbs"]}


def plys(scene):
    return {f"ply_{o}": f"{R}/{scene}/gaussians/{o}.ply" for o in kept(scene)}


def voxels(scene):
    return {f"vox_{o}": f"{R}/{scene}/voxels/{o}.npz" for o in dynamic(scene)}


def train_inputs(wc):
    s = wc.scene
    inputs = {"scene_json": f"{R}/{s}/scene/scene.json", "motion": SCENES[s]["motion"]}
    inputs.update(plys(s), **voxels(s), text=f"{R}/{s}/condition/text.safetensors")
    return inputs


def trained_inputs(wc):
    s = wc.scene
    state = f"{R}/{s}/train/{SCENES[s]['final']}.pt"
    return {"scene_json": f"{R}/{s}/scene/scene.json", "state": state, **plys(s), **voxels(s)}


def export_inputs(wc):
    glbs = {f"src_{g.rsplit('/', 1)[1][:-4]}": g for g in SCENES[wc.scene]["glbs"]}
    return {**trained_inputs(wc), **{k: v for k, v in glbs.items() if k[4:] in kept(wc.scene)}}


def losses(scene):
    stages = ["coarse", "fine"] if SCENES[scene]["final"] == "fine" else ["coarse"]
    return {st: f"{R}/{scene}/train/{st}_losses.tsv" for st in stages}


def evaluate_inputs(wc):
    s = wc.scene
    inputs = {**trained_inputs(wc), "ref": f"{R}/{s}/reference/ref.png"}
    inputs["motion"] = SCENES[s]["motion"]
    inputs.update({f"losses_{st}": p for st, p in losses(s).items()})
    return inputs


def aggregate_inputs(wc):
    inputs = {f"metrics_{s}": f"{R}/{s}/metrics.json" for s in SCENES}
    for s in SCENES:
        inputs.update({f"losses_{s}_{st}": p for st, p in losses(s).items()})
    return inputs


def all_targets():
    targets = []
    for s in SCENES:
        targets += [f"{R}/{s}/train/{SCENES[s]['final']}.pt", f"{R}/{s}/scene/scene.json"]
        targets += [f"{R}/{s}/reference/ref.png", f"{R}/{s}/condition/text.safetensors"]
        targets += list(plys(s).values()) + list(voxels(s).values())
        e = f"{R}/{s}/export"
        targets += [f"{e}/ref_view.mp4", f"{e}/orbit.mp4", *[f"{e}/views/{v}.mp4" for v in VIEWS]]
        targets += [f"{e}/preview.gif", f"{e}/dynamic_scene.glb", f"{e}/ply"]
        targets += [f"{e}/dynamic_scene_skinned.glb", f"{e}/dynamic_splats.glb"]
        targets.append(f"{e}/viewer.html")
        targets.append(f"{R}/{s}/metrics.json")
    return targets + [f"{R}/metrics.tsv", f"{R}/plots/metrics.png", f"{R}/plots/losses.png"]


rule all:
    input:
        all_targets(),


for _name, _files in PLAN["demos"].items():

    rule:
        name:
            f"demo_{_name}"
        output:
            [f"{DEMO_DIR}/{_name}/{f}" for f in _files],
        log:
            f"{DEMO_DIR}/logs/{_name}.log",
        # ACTION


rule ingest:
    input:
        unpack(ingest_inputs),
    output:
        json=f"{R}/{{scene}}/scene/scene.json",
        meshes=directory(f"{R}/{{scene}}/scene/meshes"),
    log:
        f"{R}/{{scene}}/logs/ingest.log",
    benchmark:
        f"{R}/{{scene}}/bench/ingest.tsv"
    # ACTION


rule gaussians:
    input:
        scene_json=f"{R}/{{scene}}/scene/scene.json",
        meshes=f"{R}/{{scene}}/scene/meshes",
    output:
        f"{R}/{{scene}}/gaussians/{{obj}}.ply",
    log:
        f"{R}/{{scene}}/logs/gaussians_{{obj}}.log",
    benchmark:
        f"{R}/{{scene}}/bench/gaussians_{{obj}}.tsv"
    # ACTION


rule voxelize:
    input:
        scene_json=f"{R}/{{scene}}/scene/scene.json",
        meshes=f"{R}/{{scene}}/scene/meshes",
        gaussians=f"{R}/{{scene}}/gaussians/{{obj}}.ply",
    output:
        f"{R}/{{scene}}/voxels/{{obj}}.npz",
    log:
        f"{R}/{{scene}}/logs/voxelize_{{obj}}.log",
    benchmark:
        f"{R}/{{scene}}/bench/voxelize_{{obj}}.tsv"
    # ACTION


rule reference:
    input:
        unpack(lambda wc: plys(wc.scene)),
        scene_json=f"{R}/{{scene}}/scene/scene.json",
    output:
        png=f"{R}/{{scene}}/reference/ref.png",
        orbit=f"{R}/{{scene}}/reference/static_orbit.mp4",
    log:
        f"{R}/{{scene}}/logs/reference.log",
    benchmark:
        f"{R}/{{scene}}/bench/reference.tsv"
    # ACTION


rule condition:
    output:
        f"{R}/{{scene}}/condition/text.safetensors",
    log:
        f"{R}/{{scene}}/logs/condition.log",
    benchmark:
        f"{R}/{{scene}}/bench/condition.tsv"
    # ACTION


rule train_coarse:
    input:
        unpack(train_inputs),
    output:
        state=f"{R}/{{scene}}/train/coarse.pt",
        losses=f"{R}/{{scene}}/train/coarse_losses.tsv",
    log:
        f"{R}/{{scene}}/logs/train_coarse.log",
    benchmark:
        f"{R}/{{scene}}/bench/train_coarse.tsv"
    resources:
        gpu=1,
    # ACTION


rule train_fine:
    input:
        unpack(train_inputs),
        handoff=f"{R}/{{scene}}/train/coarse.pt",
    output:
        state=f"{R}/{{scene}}/train/fine.pt",
        losses=f"{R}/{{scene}}/train/fine_losses.tsv",
    log:
        f"{R}/{{scene}}/logs/train_fine.log",
    benchmark:
        f"{R}/{{scene}}/bench/train_fine.tsv"
    resources:
        gpu=1,
    # ACTION


rule export:
    input:
        unpack(export_inputs),
    output:
        ref_view=f"{R}/{{scene}}/export/ref_view.mp4",
        orbit=f"{R}/{{scene}}/export/orbit.mp4",
        front=f"{R}/{{scene}}/export/views/front.mp4",
        right=f"{R}/{{scene}}/export/views/right.mp4",
        back=f"{R}/{{scene}}/export/views/back.mp4",
        left=f"{R}/{{scene}}/export/views/left.mp4",
        gif=f"{R}/{{scene}}/export/preview.gif",
        glb=f"{R}/{{scene}}/export/dynamic_scene.glb",
        skinned=f"{R}/{{scene}}/export/dynamic_scene_skinned.glb",
        splats=f"{R}/{{scene}}/export/dynamic_splats.glb",
        ply=directory(f"{R}/{{scene}}/export/ply"),
    log:
        f"{R}/{{scene}}/logs/export.log",
    benchmark:
        f"{R}/{{scene}}/bench/export.tsv"
    # ACTION


rule evaluate:
    input:
        unpack(evaluate_inputs),
    output:
        metrics=f"{R}/{{scene}}/metrics.json",
        frame0=f"{R}/{{scene}}/eval/frame0_vs_ref.png",
        losses=f"{R}/{{scene}}/eval/losses.png",
    log:
        f"{R}/{{scene}}/logs/evaluate.log",
    benchmark:
        f"{R}/{{scene}}/bench/evaluate.tsv"
    # ACTION


rule viewer:
    input:
        glb=f"{R}/{{scene}}/export/dynamic_scene_skinned.glb",
    output:
        html=f"{R}/{{scene}}/export/viewer.html",
    log:
        f"{R}/{{scene}}/logs/viewer.log",
    benchmark:
        f"{R}/{{scene}}/bench/viewer.tsv"
    # ACTION


rule aggregate:
    input:
        unpack(aggregate_inputs),
    output:
        tsv=f"{R}/metrics.tsv",
        bars=f"{R}/plots/metrics.png",
        losses=f"{R}/plots/losses.png",
    log:
        f"{R}/logs/aggregate.log",
    benchmark:
        f"{R}/bench/aggregate.tsv"
    # ACTION
"""


SCRIPT = 'conda:\n    "envs/toy.yaml"\nscript:\n    "scripts/touch.py"'
SHELL = 'shell:\n    "touch {output}"'
#: toy kind -> its rules' directives; "report" is "script+conda" with the real report() outputs
TOYS = {
    "script+conda": SCRIPT,
    "bare": SHELL,
    "script": 'script:\n    "scripts/touch.py"',
    "conda": 'conda:\n    "envs/toy.yaml"\n' + SHELL,
    "report": SCRIPT,
}
#: the outputs the real rules mark report() (rules/export, evaluate, viewer, report.smk)
REPORTED = {
    "export": ("ref_view", "orbit", "front", "right", "back", "left", "gif"),
    "evaluate": ("metrics", "frame0", "losses"),
    "viewer": ("html",),
    "aggregate": ("tsv", "bars", "losses"),
}


def reported(snakefile: str) -> str:
    """``snakefile`` with the :data:`REPORTED` outputs wrapped in ``report()`` as the real rules
    wrap them (caption, category, subcategory, labels)."""
    head, *rules = snakefile.split("\nrule ")
    for i, text in enumerate(rules):
        name = text.split(":", 1)[0]
        for key in REPORTED.get(name, ()):
            scene = name != "aggregate"
            category = '"{scene}"' if scene else '"all scenes"'
            labels = (
                f'{{"scene": "{{scene}}", "view": "{key}"}}' if scene else f'{{"figure": "{key}"}}'
            )
            text, n = re.subn(
                rf'^(\s+){key}=(f".*?"),$',
                rf'\1{key}=report(\2, caption="report/caption.rst", category={category}, '
                rf'subcategory="toy", labels={labels}),',
                text,
                count=1,
                flags=re.MULTILINE,
            )
            assert n == 1, (name, key)
        rules[i] = text
    return "\nrule ".join([head, *rules])


TOUCH = "for path in snakemake.output:\n    open(path, 'a').close()\n"


def write_workdir(root: Path, n: int) -> Path:
    """config/config.yaml (the default config) and a sheet of ``n`` scenes under ``root``."""
    from chord.scene import demo

    (root / "config").mkdir(parents=True)
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    conf["scene_overrides"] = {}
    (root / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    names = list(demo.DEMO_SCENES)
    rows = ["scene\tdata\tprompt"]
    for i in range(n):
        name = names[i % len(names)]
        prompt = f"scene {i}: {demo.DEMO_SCENES[name]['prompt']}"
        rows.append(f"s{i:05d}\t{conf['demo_dir']}/{name}\t{prompt}")
    (root / "config/scenes.tsv").write_text("\n".join(rows) + "\n")
    return root


def write_toy(work: Path, kind: str = "script+conda") -> Path:
    """The toy Snakefile and its plan.json (each scene's demo files, object roles, final
    training stage and motion.json) for the sheet in ``work``; returns the Snakefile. ``bare``:
    shell rules instead of the real rules' conda and script directives."""
    from chord.config import settings
    from chord.scene import demo

    conf = settings.load(
        settings.read_yaml(work / "config/config.yaml"), base=work
    )  # data: absolute
    demo_dir = yaml.safe_load((work / "config/config.yaml").read_text())["demo_dir"]
    scenes = {}
    for name, spec in conf.scenes.items():
        folder = Path(spec.data).relative_to(work)  # as the sheet has it
        glbs = [f"{folder}/{f}" for f in demo.demo_files(folder.name) if f.endswith(".glb")]
        n_objects = sum(1 for g in glbs if Path(g).name.startswith("obj_"))
        scenes[name] = {
            "glbs": glbs,
            "roles": settings.object_roles(spec.method, n_objects),
            "final": settings.final_stage(spec.method),
            "motion": f"{folder}/motion.json",
        }
    used = {Path(s["motion"]).parent.name for s in scenes.values()}
    plan = {
        "demo_dir": demo_dir,
        "demos": {name: demo.demo_files(name) for name in sorted(used)},
        "scenes": scenes,
    }
    (work / "plan.json").write_text(json.dumps(plan))
    toy = work / "toy"
    (toy / "envs").mkdir(parents=True)
    (toy / "scripts").mkdir()
    (toy / "envs/toy.yaml").write_text("channels: [conda-forge]\ndependencies: [python]\n")
    (toy / "scripts/touch.py").write_text(TOUCH)
    (toy / "report").mkdir()
    (toy / "report/caption.rst").write_text("A toy result.\n")
    lines = []
    for line in TOY.splitlines(keepends=True):
        if line.strip() == "# ACTION":
            indent = line[: len(line) - len(line.lstrip())]
            line = "".join(f"{indent}{a}\n" for a in TOYS[kind].splitlines())
        lines.append(line)
    text = "".join(lines)
    (toy / "Snakefile").write_text(reported(text) if kind == "report" else text)
    return toy / "Snakefile"


def snakemake(
    workdir: Path, *args: str, snakefile: Path = REPO / "Snakefile"
) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run a dry run; returns the process, its wall time and its CPU time (s)."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile)]
    cmd += ["--directory", str(workdir), "--cores", "2", "-n", *args]
    if snakefile != REPO / "Snakefile":
        cmd += ["--workflow-profile", "none"]  # the toy has none (the real one: profiles/default)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc, wall, cpu


def planned_jobs(workdir: Path, snakefile: Path = REPO / "Snakefile") -> dict[str, int]:
    """Rule -> jobs a dry run plans (its job stats, without the 'total' row)."""
    proc, _, _ = snakemake(workdir, "--quiet", "rules", snakefile=snakefile)
    rows = re.findall(r"^(\S+)\s+(\d+)\s*$", proc.stdout + proc.stderr, re.MULTILINE)
    return {rule: int(count) for rule, count in rows if rule not in ("total", "count")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--repeat", type=int, default=2, help="runs per size; the best is shown")
    parser.add_argument(
        "--bare-toy", action="store_true", help="toy rules without conda and script directives"
    )
    parser.add_argument(
        "--toy",
        choices=list(TOYS),
        default="script+conda",
        help="the toy's directives (bare: --bare-toy; report: script+conda and report() outputs)",
    )
    args = parser.parse_args()
    head = ["scenes", "jobs", "wall (s)", "CPU (s)", "toy jobs", "toy wall", "toy CPU", "ratio"]
    print("  ".join(f"{h:>9}" for h in head))
    for n in args.scenes:
        with tempfile.TemporaryDirectory() as tmp:
            work = write_workdir(Path(tmp), n)
            toy = write_toy(work, "bare" if args.bare_toy else args.toy)
            real_runs, toy_runs = [], []
            for _ in range(args.repeat):  # interleaved: a load change hits both alike
                real_runs.append(snakemake(work, "--quiet")[1:])
                toy_runs.append(snakemake(work, "--quiet", snakefile=toy)[1:])
            jobs, toy_jobs = planned_jobs(work), planned_jobs(work, toy)
        # the same DAG apart from the real workflow's code-digest jobs (rule code)
        real_rules = {r: c for r, c in jobs.items() if r != "code"}
        if real_rules != toy_jobs:
            raise SystemExit(f"the toy's jobs differ from the real ones: {toy_jobs} != {jobs}")
        wall, cpu = min(w for w, _ in real_runs), min(c for _, c in real_runs)
        toy_wall, toy_cpu = min(w for w, _ in toy_runs), min(c for _, c in toy_runs)
        row = [n, sum(jobs.values()), f"{wall:.2f}", f"{cpu:.2f}", sum(toy_jobs.values())]
        row += [f"{toy_wall:.2f}", f"{toy_cpu:.2f}", f"{wall / toy_wall:.2f}"]
        print("  ".join(f"{v:>9}" for v in row), flush=True)


if __name__ == "__main__":
    main()
