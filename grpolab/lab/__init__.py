"""One lab run, end to end: prepared before anything loads, measured while it trains, ended truthfully.

- `prepare`: the device, the settings, the sheet and the prompts, before anything loads.
- `session`: `run_lab`, the MLflow run around the lesson and everything it does (the chapters call it).
- `run`: the lesson's `Run`: its settings, prompts, policy loader and `train(trainer)`.
- `meter`: what a run measures while it trains (the trainer's callback).
- `console`: the terminal: the first screen, the progress bar, one line per step.
- `forkserver`: lab processes forked from one parent that imported the stack once (the suite, the
  sweep's cells and the matrix start their labs there).

May import: task, budgets, grpolab.config, grpolab.memory, grpolab.lifecycle, grpolab.tiny_model,
grpolab.model, grpolab.judging.
"""
