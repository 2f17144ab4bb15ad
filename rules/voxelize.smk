rule voxelize:
    input:
        unpack(planned("geometry")),
        gaussians=results_layout.gaussians_ply(RESULTS, "{scene}", "{obj}"),
        code=code("voxelize"),
    output:
        results_layout.voxels_npz(RESULTS, "{scene}", "{obj}"),
    log:
        results_layout.log(RESULTS, "{scene}", "voxelize_{obj}"),
    benchmark:
        results_layout.bench(RESULTS, "{scene}", "voxelize_{obj}")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "voxelize"),
    script:
        "../workflow/scripts/voxelize.py"
