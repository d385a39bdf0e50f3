"""A run's life in MLflow: where it is recorded, how it ends, and how it resumes.

- `tracking`: the store, the experiment, what every run records, and its description.
- `store`: the tracking store checked before anything loads.
- `endings`: how a run ends whatever ends it (signals, a dead process, a full disk): status, tag, exit code.
- `step_boundary`, `checkpoints`, `resume`: each step ends whole, what a stopped run leaves, `--resume`.
- `atomic`: a model folder written whole or not at all.

May import: task, budgets, grpolab.config, grpolab.memory.
"""
