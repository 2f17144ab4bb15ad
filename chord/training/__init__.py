"""A training: the Trainer's iteration, the run loop, checkpoints, the optimiser, randomness,
ranks, time limits and what it reports while it runs."""
