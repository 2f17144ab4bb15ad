# Adapter: rule export -> chord.stages.export.run
from pathlib import Path

from chord import paths
from chord.stages import export
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    spec = scene_spec(snakemake.config, snakemake.wildcards.scene)
    inp, out = snakemake.input, snakemake.output
    keyed = lambda prefix: {k[len(prefix) :]: Path(v) for k, v in inp.items() if k.startswith(prefix)}
    export.run(
        scene_json=Path(inp.scene_json),
        plys=keyed("ply_"),
        voxels=keyed("vox_"),
        state_path=Path(inp.state),
        sources=keyed("src_"),
        method=spec.method,
        out_ref_view=Path(out.ref_view),
        out_orbit=Path(out.orbit),
        out_views={v: Path(getattr(out, v)) for v in paths.FIXED_VIEWS},
        out_gif=Path(out.gif),
        out_glb=Path(out.glb),
        out_skinned_glb=Path(out.skinned),
        out_ply_dir=Path(out.ply),
    )
