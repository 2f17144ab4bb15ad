# Adapter: rules train_coarse / train_fine -> chord.stages.train.run, on this attempt's memory
# tier (snakemake.resources.tier: memory flags are resources, never params; DESIGN §6).
from pathlib import Path

from chord.plan import scene_plan
from chord.stages import train
from chord.stages.adapter import INPUT_ERROR_RECORD, input_error_once, stage_logging, tiered_job

# The log of every attempt (a retry on the next tier, a requeued job) until one completes.
ckpt = Path(snakemake.params.checkpoints)
with stage_logging(snakemake.log[0], history=ckpt / "train.log"), input_error_once(ckpt / INPUT_ERROR_RECORD, snakemake.resources.attempt):
    inp = scene_plan.record(snakemake.input.items())
    train.run(
        snakemake.rule.removeprefix("train_"),
        **tiered_job(snakemake, snakemake.wildcards.run),
        inputs={"scene_json": inp["scene_json"], "plys": inp["plys"], "voxels": inp["voxels"], "text_path": inp["text"]},
        out=Path(snakemake.output.state),
        loss_log=Path(snakemake.output.losses),
        checkpoint_dir=Path(snakemake.params.checkpoints),
        handoff=inp.get("handoff"),
        attempt=snakemake.resources.attempt,
    )
