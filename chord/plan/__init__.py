"""The workflow's plan, decided without torch: a scene's plan, the results layout, the training
and preview jobs, each stage's code sources."""
