# Adapter: rules train_coarse / train_fine -> chord.stages.train.run_stage, on this attempt's
# memory tier (snakemake.resources.tier: memory flags are resources, never params; DESIGN §6).
import os
from pathlib import Path

import torch

from chord import config as cc
from chord import tiers
from chord.stages import train
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    conf = cc.load(snakemake.config)
    spec = conf.scenes[snakemake.wildcards.scene]
    stage = snakemake.rule.removeprefix("train_")
    tier = tiers.parse(conf.tiers)[snakemake.resources.tier]
    checkpoints = Path(snakemake.params.checkpoints)
    inp = snakemake.input
    with tiers.job_gpu(os.environ), tiers.out_of_memory_record(checkpoints / tiers.OOM_RECORD, tier.name):
        tiers.inject_out_of_memory(os.environ.get("CHORD_TEST_OOM_TIERS", ""), tier.name)
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
            checkpoint_dir=checkpoints,
            method=tiers.apply(spec.method, tier),
            guidance=conf.guidance,
            handoff=Path(inp.handoff) if stage == "fine" else None,
            tier=tier.name,
            render_backend=conf.render_backend,
            env=os.environ,
            device="cuda" if torch.cuda.is_available() else "cpu",
        )
