# Adapter: rule reference -> chord.stages.reference.run
from pathlib import Path

from chord.stages import reference
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    spec = scene_spec(snakemake.config, snakemake.wildcards.scene)
    plys = {k: Path(v) for k, v in snakemake.input.items() if k.startswith("obj_")}
    reference.run(
        scene_json=Path(snakemake.input.scene_json),
        plys=plys,
        out_png=Path(snakemake.output.png),
        out_orbit=Path(snakemake.output.orbit),
        method=spec.method,
    )
