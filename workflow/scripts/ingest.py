# Adapter: rule ingest -> chord.stages.ingest.run
from pathlib import Path

from chord.stages import ingest
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    spec = scene_spec(snakemake.config, snakemake.wildcards.scene)
    ingest.run(
        data=spec.data,
        out_json=Path(snakemake.output.json),
        out_meshes=Path(snakemake.output.meshes),
        method=spec.method,
        scene=spec.scene,
        mem_mb=getattr(snakemake.resources, "mem_mb", None),  # the budget of its reads
    )
