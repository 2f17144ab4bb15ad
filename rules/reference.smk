rule reference:
    input:
        unpack(planned("reference")),
        code=code("reference"),
    output:
        png=P.reference_png(RESULTS, "{scene}"),
        orbit=P.static_orbit_mp4(RESULTS, "{scene}"),
    log:
        P.log(RESULTS, "{scene}", "reference"),
    benchmark:
        P.bench(RESULTS, "{scene}", "reference")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "reference"),
    script:
        "../workflow/scripts/reference.py"
