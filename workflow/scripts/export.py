# Adapter: rule export -> chord.stages.export.run
from pathlib import Path

from chord.plan import results_layout
from chord.plan import scene_plan
from chord.stages import export
from chord.stages.adapter import stage_logging, trained_run

with stage_logging(snakemake.log[0]):
    inp, out = scene_plan.record(snakemake.input.items()), snakemake.output
    export.run(
        **trained_run(snakemake, inp),
        sources=inp["sources"],
        out_ref_view=Path(out.ref_view),
        out_orbit=Path(out.orbit),
        out_views={v: Path(getattr(out, v)) for v in results_layout.FIXED_VIEWS},
        out_gif=Path(out.gif),
        out_glb=Path(out.glb),
        out_skinned_glb=Path(out.skinned),
        out_splats_glb=Path(out.splats),
        out_splats_rigid_glb=Path(out.splats_rigid),
        out_trajectories=Path(out.trajectories),
        out_trajectories_json=Path(out.trajectories_json),
        out_usd=Path(out.usd),
        out_usd_splats=Path(out.usd_splats),
        out_ply_dir=Path(out.ply),
    )
