rule export:
    input:
        unpack(planned("export")),
        code=code("export"),
    output:
        ref_view=report(
            P.ref_view_mp4(RESULTS, "{run}"),
            caption="../workflow/report/ref_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "reference camera"},
        ),
        orbit=report(
            P.orbit_mp4(RESULTS, "{run}"),
            caption="../workflow/report/orbit.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "orbit"},
        ),
        front=report(
            P.fixed_view_mp4(RESULTS, "{run}", "front"),
            caption="../workflow/report/fixed_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "front (azimuth 0)"},
        ),
        right=report(
            P.fixed_view_mp4(RESULTS, "{run}", "right"),
            caption="../workflow/report/fixed_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "right (azimuth 90)"},
        ),
        back=report(
            P.fixed_view_mp4(RESULTS, "{run}", "back"),
            caption="../workflow/report/fixed_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "back (azimuth 180)"},
        ),
        left=report(
            P.fixed_view_mp4(RESULTS, "{run}", "left"),
            caption="../workflow/report/fixed_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "left (azimuth 270)"},
        ),
        gif=report(
            P.preview_gif(RESULTS, "{run}"),
            caption="../workflow/report/preview.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "GIF preview"},
        ),
        glb=P.dynamic_glb(RESULTS, "{run}"),
        skinned=P.dynamic_skinned_glb(RESULTS, "{run}"),
        splats=P.dynamic_splats_glb(RESULTS, "{run}"),
        splats_rigid=P.dynamic_splats_rigid_glb(RESULTS, "{run}"),
        trajectories=report(
            P.trajectories_npz(RESULTS, "{run}"),
            caption="../workflow/report/trajectories.rst",
            category="{run}",
            subcategory="exports",
            labels={"scene": "{run}", "file": "object trajectories"},
        ),
        trajectories_json=P.trajectories_json(RESULTS, "{run}"),
        usd=P.scene_usda(RESULTS, "{run}"),
        usd_splats=P.scene_splats_usd(RESULTS, "{run}"),
        ply=directory(P.ply_sequence_dir(RESULTS, "{run}")),
    log:
        P.log(RESULTS, "{run}", "export"),
    benchmark:
        P.bench(RESULTS, "{run}", "export")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.run, "export"),
    script:
        "../workflow/scripts/export.py"
