# Adapter: rule demo_<name> -> chord.demo.write_demo_scene
from pathlib import Path

from chord import demo
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    # the scene folder is the parent of every output
    demo.write_demo_scene(
        snakemake.params.name,
        Path(snakemake.output[0]).parent.parent,
        frame_num=snakemake.params.frame_num,
    )
