rule export:
    input:
        unpack(planned("export")),
        code=code("export"),
    output:
        ref_view=report(
            results_layout.ref_view_mp4(RESULTS, "{run}"),
            caption="../workflow/report/ref_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "reference camera"},
        ),
        orbit=report(
            results_layout.orbit_mp4(RESULTS, "{run}"),
            caption="../workflow/report/orbit.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "orbit"},
        ),
        front=report(
            results_layout.fixed_view_mp4(RESULTS, "{run}", "front"),
            caption="../workflow/report/fixed_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "front (azimuth 0)"},
        ),
        right=report(
            results_layout.fixed_view_mp4(RESULTS, "{run}", "right"),
            caption="../workflow/report/fixed_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "right (azimuth 90)"},
        ),
        back=report(
            results_layout.fixed_view_mp4(RESULTS, "{run}", "back"),
            caption="../workflow/report/fixed_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "back (azimuth 180)"},
        ),
        left=report(
            results_layout.fixed_view_mp4(RESULTS, "{run}", "left"),
            caption="../workflow/report/fixed_view.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "left (azimuth 270)"},
        ),
        gif=report(
            results_layout.preview_gif(RESULTS, "{run}"),
            caption="../workflow/report/preview.rst",
            category="{run}",
            subcategory="videos",
            labels={"scene": "{run}", "view": "GIF preview"},
        ),
        glb=results_layout.dynamic_glb(RESULTS, "{run}"),
        skinned=results_layout.dynamic_skinned_glb(RESULTS, "{run}"),
        splats=results_layout.dynamic_splats_glb(RESULTS, "{run}"),
        splats_rigid=results_layout.dynamic_splats_rigid_glb(RESULTS, "{run}"),
        trajectories=report(
            results_layout.trajectories_npz(RESULTS, "{run}"),
            caption="../workflow/report/trajectories.rst",
            category="{run}",
            subcategory="exports",
            labels={"scene": "{run}", "file": "object trajectories"},
        ),
        trajectories_json=results_layout.trajectories_json(RESULTS, "{run}"),
        usd=results_layout.scene_usda(RESULTS, "{run}"),
        usd_splats=results_layout.scene_splats_usd(RESULTS, "{run}"),
        ply=directory(results_layout.ply_sequence_dir(RESULTS, "{run}")),
    log:
        results_layout.log(RESULTS, "{run}", "export"),
    benchmark:
        results_layout.bench(RESULTS, "{run}", "export")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.run, "export"),
    script:
        "../workflow/scripts/export.py"
