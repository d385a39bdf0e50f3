"""Memory: the card, what a run holds on it, and the budget's lines beside what was measured.

- `device`: which GPU (or none) and how much memory, read through NVML without starting CUDA.
- `probe`: the sampler thread and the phases of a run (load, generate, train).
- `tensors`, `vllm_ledger`: the exact lines measured on the live objects, and vLLM's own start-up ledger.
- `comparison`: budget beside measured, line by line: the table and the chart.
- `oom`: an out-of-memory error recognised, the line to blame and what to change.
- `names`: the MLflow name and unit of every memory figure.
- `run_result`: a run's figures as `result.json`, for the process that started it (a sweep's cell).

May import: task, budgets, grpolab.config.
"""
