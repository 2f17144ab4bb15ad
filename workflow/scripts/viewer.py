# Adapter: rule viewer -> chord.stages.viewer.run
from pathlib import Path

from chord.stages import viewer
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    scene = snakemake.wildcards.run
    viewer.run(
        glb=Path(snakemake.input.glb),
        splats=Path(snakemake.input.splats),
        out=Path(snakemake.output.html),
        splats_out=Path(snakemake.output.splats),
        title=f"{scene}: {scene_spec(snakemake.config, scene).prompt}",
    )
