# Adapter: rule demo_<name> -> chord.stages.demo.run
from pathlib import Path

from chord.stages import demo
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    # the scene folder is the parent of every output
    demo.run(
        name=snakemake.params.name,
        out_dir=Path(snakemake.output[0]).parent.parent,
        frame_num=snakemake.params.frame_num,
    )
