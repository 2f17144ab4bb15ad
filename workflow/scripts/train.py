# Adapter: rules train_coarse / train_fine -> chord.stages.train.run_stage
from pathlib import Path

from chord import config as cc
from chord.stages import train
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    conf = cc.load(snakemake.config)
    spec = conf.scenes[snakemake.wildcards.scene]
    stage = snakemake.rule.removeprefix("train_")
    inp = snakemake.input
    train.run_stage(
        stage,
        inputs={
            "scene_json": Path(inp.scene_json),
            "plys": {k[len("ply_") :]: Path(v) for k, v in inp.items() if k.startswith("ply_")},
            "voxels": {k[len("vox_") :]: Path(v) for k, v in inp.items() if k.startswith("vox_")},
            "text_path": Path(inp.text),
            "data_dir": spec.data,
        },
        out=Path(snakemake.output.state),
        loss_log=Path(snakemake.output.losses),
        checkpoint_dir=Path(snakemake.params.checkpoints),
        method=spec.method,
        guidance=conf.guidance,
        handoff=Path(inp.handoff) if stage == "fine" else None,
    )
