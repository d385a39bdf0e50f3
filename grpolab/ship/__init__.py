"""Chapter 6: ship the adapter as a model others run, and prove each step kept what GRPO taught.

`grpolab.ship.main` is the chapter's harness: it finds the training run (grpolab.ship.source), takes
its adapter through the stages a user takes it (grpolab.ship.stages: reload, the 16-bit and the 4-bit
merge (grpolab.ship.merge), GGUF (grpolab.ship.gguf_file), a real server (grpolab.ship.serve)), scores
each on the run's held-out prompts, and logs it all in one MLflow run (tag run_kind=ship) whose
Overview says which stages kept what GRPO taught, with the 16-bit merge registered as a model.
"""

from grpolab.ship.lab import main

__all__ = ["main"]
