"""Chapter 6: ship the adapter as a model others run, and prove each step kept what GRPO taught.

`grpolab.chapters.ship.main` is the chapter's harness: it finds the training run (grpolab.chapters.ship.source), takes
its adapter through the stages a user takes it (grpolab.chapters.ship.stages: reload, the 16-bit and the 4-bit
merge (grpolab.chapters.ship.merge), GGUF (grpolab.chapters.ship.gguf_file), a real server (grpolab.chapters.ship.serve)), scores
each on the run's held-out prompts, and logs it all in one MLflow run (tag run_kind=ship) whose
Overview says which stages kept what GRPO taught, with the 16-bit merge registered as a model.
"""

from grpolab.chapters.ship.lab import main

__all__ = ["main"]
