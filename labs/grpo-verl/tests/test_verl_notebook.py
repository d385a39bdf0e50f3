"""notebooks/03-grpo-verl.ipynb: committed without outputs, the same as its percent script, and it runs
from a clean kernel of this environment (the main suite cannot run it: verl is not in its lock)."""

from __future__ import annotations

import jupytext
import nbformat
import pytest
from grpo_verl.settings import REPO_ROOT

NOTEBOOK = REPO_ROOT / "notebooks" / "03-grpo-verl.ipynb"


def test_committed_without_outputs_and_in_sync_with_its_script():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.outputs and c.execution_count is None for c in nb.cells if c.cell_type == "code")
    script = jupytext.read(NOTEBOOK.with_suffix(".py"))
    pairs = list(zip(script.cells, nb.cells, strict=True))
    assert all((a.cell_type, a.source) == (b.cell_type, b.source) for a, b in pairs), (
        "run `uv run --project labs/grpo-verl jupytext --sync notebooks/03-grpo-verl.py`"
    )


@pytest.mark.timeout(600)
def test_the_notebook_runs_from_a_clean_kernel():
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    text = "\n".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )
    assert "verl 0.9.1" in text
    for marker in (
        "_compute_advantage",
        "ground_truth",
        "compute_score",
        "RLOO TRL",
        "Qwen/Qwen3-4B",
        "verdict: fits",
    ):
        assert marker in text, f"the notebook no longer shows {marker!r}"
