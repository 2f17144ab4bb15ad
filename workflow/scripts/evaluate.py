# Adapter: rule evaluate -> chord.stages.evaluate.run
from pathlib import Path

from chord.stages import evaluate
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    spec = scene_spec(snakemake.config, snakemake.wildcards.scene)
    inp, out = snakemake.input, snakemake.output
    keyed = lambda prefix: {k[len(prefix) :]: Path(v) for k, v in inp.items() if k.startswith(prefix)}
    evaluate.run(
        scene_json=Path(inp.scene_json),
        plys=keyed("ply_"),
        voxels=keyed("vox_"),
        state_path=Path(inp.state),
        ref_png=Path(inp.ref),
        loss_logs=keyed("losses_"),
        motion_json=Path(inp.motion) if "motion" in inp.keys() else None,
        method=spec.method,
        out_json=Path(out.metrics),
        out_frame0=Path(out.frame0),
        out_losses=Path(out.losses),
    )
