rule gaussians:
    input:
        unpack(planned("geometry")),
        fitted=fitted_ply,
        code=code("gaussians"),
    output:
        P.gaussians_ply(RESULTS, "{scene}", "{obj}"),
    log:
        P.log(RESULTS, "{scene}", "gaussians_{obj}"),
    benchmark:
        P.bench(RESULTS, "{scene}", "gaussians_{obj}")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "gaussians"),
    script:
        "../workflow/scripts/gaussians.py"
