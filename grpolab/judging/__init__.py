"""Judging a run: did the policy learn the task, or only the reward, and what held it back.

- `evaluate`: held-out accuracy, base beside adapter, on prompts no training set holds.
- `doctor`: the run doctor's findings, each with the flags of its next step.
- `completions`: what the model wrote, with its rewards and advantages, as MLflow traces.
- `overview`: the run's Overview: the verdict, the figure, the tables, written to MLflow.
- `claims`: what a chapter claims of its CPU run, checked the same way by its tests and the matrix.
- `task_check`: the task's pre-flight (task.check) before anything loads, and its table in the run.

May import: task, budgets, grpolab.config, grpolab.memory, grpolab.lifecycle, grpolab.tiny_model,
grpolab.model.
"""
