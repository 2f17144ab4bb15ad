# Adapter: rule gaussians -> chord.stages.gaussians.run
from pathlib import Path

from chord.stages import gaussians
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    spec = scene_spec(snakemake.config, snakemake.wildcards.scene)
    gaussians.run(
        scene_json=Path(snakemake.input.scene_json),
        obj=snakemake.wildcards.obj,
        out=Path(snakemake.output[0]),
        method=spec.method,
        fitted=spec.gaussians,
    )
