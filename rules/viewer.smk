# The scene's 3D viewer: one self-contained HTML page playing its animated GLB (issue 16).
# Local: it takes well under a second, and the page is a report result.
localrules:
    viewer,


rule viewer:
    input:
        glb=P.dynamic_skinned_glb(RESULTS, "{run}"),
        code=code("viewer"),
    output:
        html=report(
            P.viewer_html(RESULTS, "{run}"),
            caption="../workflow/report/viewer.rst",
            category="{run}",
            subcategory="3D",
            labels={"scene": "{run}", "view": "3D viewer"},
        ),
    log:
        P.log(RESULTS, "{run}", "viewer"),
    benchmark:
        P.bench(RESULTS, "{run}", "viewer")
    conda:
        "../workflow/envs/chord.yaml"
    script:
        "../workflow/scripts/viewer.py"
