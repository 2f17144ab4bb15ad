# The scene's 3D viewers: self-contained HTML pages playing its skinned GLB (issue 16) and its
# Gaussians as splats (issue 24). Local: well under a second; both pages are report results.
localrules:
    viewer,


rule viewer:
    input:
        glb=P.dynamic_skinned_glb(RESULTS, "{scene}"),
        splats=P.dynamic_splats_glb(RESULTS, "{scene}"),
        code=code("viewer"),
    output:
        html=report(
            P.viewer_html(RESULTS, "{scene}"),
            caption="../workflow/report/viewer.rst",
            category="{scene}",
            subcategory="3D",
            labels={"scene": "{scene}", "view": "3D viewer"},
        ),
        splats=report(
            P.splats_html(RESULTS, "{scene}"),
            caption="../workflow/report/splats.rst",
            category="{scene}",
            subcategory="3D",
            labels={"scene": "{scene}", "view": "splat player"},
        ),
    log:
        P.log(RESULTS, "{scene}", "viewer"),
    benchmark:
        P.bench(RESULTS, "{scene}", "viewer")
    conda:
        "../workflow/envs/chord.yaml"
    script:
        "../workflow/scripts/viewer.py"
