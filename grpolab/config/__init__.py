"""The run's configuration: what a lab is asked to do, and how its process computes.

- `settings`: the book's recipe (grpolab/recipe.toml), a chapter's lab.toml, the command line; one validator.
- `layouts`: how a chapter's generation and training share the cards.
- `flags`: the flags every chapter has, one per setting.
- `numerics`: the CPU profile's pinned arithmetic, the same bits on every x86-64 machine.
- `paths`, `errors`: where things are, and the one-line refusal (one home each).

The bottom of the harness: nothing here loads a model, measures or writes a run.

May import: task, budgets.
"""
