# Adapter: rule voxelize -> chord.stages.voxelize.run
from pathlib import Path

from chord.stages import voxelize
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    spec = scene_spec(snakemake.config, snakemake.wildcards.scene)
    voxelize.run(
        scene_json=Path(snakemake.input.scene_json),
        obj=snakemake.wildcards.obj,
        gaussians=Path(snakemake.input.gaussians),
        out=Path(snakemake.output[0]),
        method=spec.method,
    )
