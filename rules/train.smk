# Training runs on a memory tier (DESIGN §6). The tier, and the host RAM, wall time and GPU kind
# it needs, are resources computed from `attempt`, never params: a tier change re-runs nothing.
# After an out-of-memory exit the retry runs on the next leaner tier: one attempt per tier. The
# retries belong to the scheduling Snakemake (a cluster job runs Snakemake again, with
# workflow.remote_exec set): each retry is then a new job with the next tier's resources, not a
# second try inside the first job's allocation. A bad input (exit 2) is recorded and its retry
# stops at once with the same message (the `attempt` resource tells the job it is a retry).
# Both are checkpoints: once one has finished, rule preview_strip's inputs list the live previews
# it wrote beside its outputs (train/previews/, kept out of its outputs: DESIGN §3).


checkpoint train_coarse:
    input:
        unpack(train_inputs),
        code=code("train"),
    output:
        state=results_layout.train_state(RESULTS, "{run}", "coarse"),
        losses=results_layout.train_losses(RESULTS, "{run}", "coarse"),
    log:
        results_layout.log(RESULTS, "{run}", "train_coarse"),
    benchmark:
        results_layout.bench(RESULTS, "{run}", "train_coarse")
    retries: 0 if workflow.remote_exec else len(TIERS) - 1
    conda:
        "../workflow/envs/chord.yaml"
    resources:
        gpu=tier_resource("coarse", "gpus"),
        tier=tier_resource("coarse", "tier"),
        mem_mb=tier_resource("coarse", "mem_mb"),
        cpus_per_gpu=tier_resource("coarse", "cpus_per_gpu"),
        runtime=tier_resource("coarse", "runtime"),
        gpu_model=tier_resource("coarse", "gpu_model"),
        slurm_partition=tier_resource("coarse", "slurm_partition"),
        attempt=attempt_number,
    params:
        method=lambda wc: train_params(wc.run),
        checkpoints=lambda wc: str(
            results_layout.checkpoints(RESULTS, wc.run, "coarse")
        ),
    script:
        "../workflow/scripts/train.py"


checkpoint train_fine:
    input:
        unpack(train_inputs),
        handoff=results_layout.train_state(RESULTS, "{run}", "coarse"),
        code=code("train"),
    output:
        state=results_layout.train_state(RESULTS, "{run}", "fine"),
        losses=results_layout.train_losses(RESULTS, "{run}", "fine"),
    log:
        results_layout.log(RESULTS, "{run}", "train_fine"),
    benchmark:
        results_layout.bench(RESULTS, "{run}", "train_fine")
    retries: 0 if workflow.remote_exec else len(TIERS) - 1
    conda:
        "../workflow/envs/chord.yaml"
    resources:
        gpu=tier_resource("fine", "gpus"),
        tier=tier_resource("fine", "tier"),
        mem_mb=tier_resource("fine", "mem_mb"),
        cpus_per_gpu=tier_resource("fine", "cpus_per_gpu"),
        runtime=tier_resource("fine", "runtime"),
        gpu_model=tier_resource("fine", "gpu_model"),
        slurm_partition=tier_resource("fine", "slurm_partition"),
        attempt=attempt_number,
    params:
        method=lambda wc: train_params(wc.run),
        checkpoints=lambda wc: str(results_layout.checkpoints(RESULTS, wc.run, "fine")),
    script:
        "../workflow/scripts/train.py"
