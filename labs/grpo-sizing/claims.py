"""What chapter 2 claims of its CPU run (the README's sweep, its refused cell then run anyway), checked
by its tests on the suite's run and by `uv run python -m grpolab.matrix` on every seed.

The sheet decides before anything loads, and the cells bear it out: every cell it lets through runs to
the end under the CPU host's cap, and the edge it refuses runs out of memory when run anyway.
"""

from __future__ import annotations

import tempfile

from grpolab.judging.claims import ChapterStore, Claim

MATRIX_ARGS = ["--run-refused"]  # the README's second command: the refused edge, run anyway
CLAIMS = (
    Claim("every cell the sheet lets through finishes", "fitting_cells_not_finished", at_most=0),
    Claim("the sheet refuses a cell", "refused_cells", at_least=1),
    Claim("the refused edge, run anyway, runs out of memory", "edge_out_of_memory", at_least=1),
)


def figures(book: ChapterStore) -> dict[str, float]:
    parent = book.only("sweep")
    with tempfile.TemporaryDirectory() as folder:
        cells = book.artifact_json(parent, "sweep/cells.json", folder)["cells"]
    fitting = [c for c in cells if c["fits"]]
    edge = [c for c in cells if c["edge"]]
    oom = [c for c in edge if c["status"] == "ran anyway" and c["run_status"] == "FAILED" and _oom(book, c)]
    return {
        "finished": float(parent.info.status == "FINISHED"),
        "fitting_cells": float(len(fitting)),
        "fitting_cells_not_finished": float(sum(c["run_status"] != "FINISHED" for c in fitting)),
        "refused_cells": float(sum(not c["fits"] for c in cells)),
        "edge_out_of_memory": float(len(oom)),
    }


def _oom(book: ChapterStore, cell: dict) -> bool:
    return bool(book.client.get_run(cell["run_id"]).data.tags.get("oom_phase"))
