# Each stage's one code input (issue 15): the sha256 of the chord sources its result depends
# on, found from its module's imports (chord.plan.code_sources.sources). An edited source is newer than
# the digest with another content; a changed file set (input) or content under an older time
# (params) re-run this job too. The new digest re-runs its stage and what follows. A touch
# alone (same checksum) or a complete run leaves nothing to do.
localrules:
    code,


rule code:
    input:
        code_sources,
    output:
        results_layout.code_digest(CODE_ROOT, "{stage}"),
    log:
        results_layout.code_digest(CODE_ROOT, "{stage}").with_suffix(".log"),
    wildcard_constraints:
        stage="|".join(chord.plan.code_sources.STAGES),
    conda:
        "../workflow/envs/chord.yaml"
    params:
        sha=code_sha,
    shell:
        "echo {params.sha} > {output:q} && printf '%s\\n' {input:q} > {log:q}"
