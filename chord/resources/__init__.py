"""What a run asks of the machine and the scheduler: GPUs, host RAM, CUDA settings, the
peak-memory model, job sizes, memory tiers and out-of-memory records."""
