# chord-pipeline: animate static multi-object 3D scenes from a text prompt (CHORD).
# Stages in DAG order; all logic lives in the `chord` package (rules/ and workflow/scripts/ are glue).
from snakemake.utils import min_version

min_version("8.20")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/code.smk"
include: "rules/demo.smk"
include: "rules/ingest.smk"
include: "rules/gaussians.smk"
include: "rules/voxelize.smk"
include: "rules/reference.smk"
include: "rules/condition.smk"
include: "rules/preview.smk"
include: "rules/train.smk"
include: "rules/export.smk"
include: "rules/viewer.smk"
include: "rules/evaluate.smk"
include: "rules/sweep.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        all_targets(),


# `snakemake debug --config debug_scene=<id>`: one scene, few iterations, frequent checkpoints,
# outputs under debug.results (never the production results).
rule debug:
    input:
        debug_inputs,
