rule voxelize:
    input:
        unpack(planned("geometry")),
        gaussians=P.gaussians_ply(RESULTS, "{scene}", "{obj}"),
        code=code("voxelize"),
    output:
        P.voxels_npz(RESULTS, "{scene}", "{obj}"),
    log:
        P.log(RESULTS, "{scene}", "voxelize_{obj}"),
    benchmark:
        P.bench(RESULTS, "{scene}", "voxelize_{obj}")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "voxelize"),
    script:
        "../workflow/scripts/voxelize.py"
