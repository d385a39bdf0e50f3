"""What chapter 5 claims of its CPU run (the README's command: the recipe and each knob raised), checked
by its tests on the suite's run and by `uv run python -m grpolab.matrix` on every seed.

Every arm learns: whatever it spent the headroom on, its held-out accuracy rises from the same base.
Which arm bought the most is the chapter's verdict, not a claim: on a CPU a few prompts decide it.
Held-out figures are counted in prompts (of 32, the recipe's CPU count).
"""

from __future__ import annotations

import tempfile

from grpolab.judging.claims import ChapterStore, Claim, prompts

ARMS = ("recipe", "group", "length", "batch")
CLAIMS = tuple(
    Claim(
        f"the {arm} arm learns: held-out accuracy rises by at least 4 of 32 prompts",
        f"{arm}_rise",
        at_least=4,
    )
    for arm in ARMS
)


def figures(book: ChapterStore) -> dict[str, float]:
    parent = book.only("headroom")
    with tempfile.TemporaryDirectory() as folder:
        record = book.artifact_json(parent, "headroom/arms.json", folder)["arms"]
    children = {r.data.tags["headroom.arm"]: r for r in book.children(parent)}
    out = {"finished": float(parent.info.status == "FINISHED")}
    for r in record:
        n = int(children[r["arm"]].data.params["eval_prompts"])
        base, adapter = r.get("accuracy_base"), r.get("accuracy_adapter")
        if base is None or adapter is None:  # an arm that did not finish has no held-out figures
            continue
        out |= {
            f"{r['arm']}_base": prompts(base, n),
            f"{r['arm']}_adapter": prompts(adapter, n),
            f"{r['arm']}_rise": prompts(adapter - base, n),
        }
    return out
