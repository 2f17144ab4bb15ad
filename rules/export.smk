rule export:
    input:
        unpack(planned("export")),
        code=code("export"),
    output:
        ref_view=report(
            P.ref_view_mp4(RESULTS, "{scene}"),
            caption="../workflow/report/ref_view.rst",
            category="{scene}",
            subcategory="videos",
            labels={"scene": "{scene}", "view": "reference camera"},
        ),
        orbit=report(
            P.orbit_mp4(RESULTS, "{scene}"),
            caption="../workflow/report/orbit.rst",
            category="{scene}",
            subcategory="videos",
            labels={"scene": "{scene}", "view": "orbit"},
        ),
        front=report(
            P.fixed_view_mp4(RESULTS, "{scene}", "front"),
            caption="../workflow/report/fixed_view.rst",
            category="{scene}",
            subcategory="videos",
            labels={"scene": "{scene}", "view": "front (azimuth 0)"},
        ),
        right=report(
            P.fixed_view_mp4(RESULTS, "{scene}", "right"),
            caption="../workflow/report/fixed_view.rst",
            category="{scene}",
            subcategory="videos",
            labels={"scene": "{scene}", "view": "right (azimuth 90)"},
        ),
        back=report(
            P.fixed_view_mp4(RESULTS, "{scene}", "back"),
            caption="../workflow/report/fixed_view.rst",
            category="{scene}",
            subcategory="videos",
            labels={"scene": "{scene}", "view": "back (azimuth 180)"},
        ),
        left=report(
            P.fixed_view_mp4(RESULTS, "{scene}", "left"),
            caption="../workflow/report/fixed_view.rst",
            category="{scene}",
            subcategory="videos",
            labels={"scene": "{scene}", "view": "left (azimuth 270)"},
        ),
        gif=report(
            P.preview_gif(RESULTS, "{scene}"),
            caption="../workflow/report/preview.rst",
            category="{scene}",
            subcategory="videos",
            labels={"scene": "{scene}", "view": "GIF preview"},
        ),
        glb=P.dynamic_glb(RESULTS, "{scene}"),
        skinned=P.dynamic_skinned_glb(RESULTS, "{scene}"),
        splats=P.dynamic_splats_glb(RESULTS, "{scene}"),
        ply=directory(P.ply_sequence_dir(RESULTS, "{scene}")),
    log:
        P.log(RESULTS, "{scene}", "export"),
    benchmark:
        P.bench(RESULTS, "{scene}", "export")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "export"),
    script:
        "../workflow/scripts/export.py"
