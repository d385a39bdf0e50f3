"""What chapter 8 claims of its CPU run (the README's command: each cause broken, then mended by the
doctor's next step), checked by its tests on the suite's run and by `uv run python -m grpolab.matrix`
on every seed.

The lesson: each broken arm holds learning back for one reason, and the doctor names that reason and
nothing else on it; the arm that applies the next step the doctor printed learns: its held-out
accuracy rises, and the doctor names nothing on it. Held-out figures are counted in prompts (of 64).
"""

from __future__ import annotations

import tempfile

from grpolab.judging.claims import ChapterStore, Claim, prompts

# Each broken arm, and the finding the doctor must name on it.
CAUSES = {
    "cut": "cut_before_the_tag",
    "cold": "no_diversity",
    "still": "held_at_the_start",
    "leashed": "held_at_the_start",
    "mistagged": "reward_never_pays",
    "unsynced": "rollouts_not_from_policy",
    "solved": "no_learning_signal",
    "unreachable": "no_learning_signal",
}
CLAIMS = (
    *(
        Claim(f"the doctor names {f} on the {arm} arm, and nothing else", f"{arm}_named", at_least=1)
        for arm, f in CAUSES.items()
    ),
    *(
        Claim(
            f"the {arm} arm mended by the doctor's next step learns (held-out prompts of 64)",
            f"{arm}-fixed_rise",
            at_least=7,
        )
        for arm in CAUSES
    ),
    *(
        Claim(f"the doctor names nothing on the mended {arm} arm", f"{arm}-fixed_findings", at_most=0)
        for arm in CAUSES
    ),
    # The held-out evaluation before training (every lab's) shows the two no-signal arms before a step
    # is paid for: a task solved already, and one never answered (held-out prompts of 64).
    Claim("the solved arm's model answers the first digit before training", "solved_base", at_least=60),
    Claim("the unreachable arm's model never adds the digits before training", "unreachable_base", at_most=2),
)


def figures(book: ChapterStore) -> dict[str, float]:
    parent = book.only("arms")
    with tempfile.TemporaryDirectory() as folder:
        arms = {a["arm"]: a for a in book.artifact_json(parent, "arms/arms.json", folder)["arms"]}
    n = int(book.children(parent)[0].data.params["eval_prompts"])
    out = {"finished": float(parent.info.status == "FINISHED")}
    for name, arm in arms.items():
        base, adapter = (arm["held_out"][which]["accuracy"] for which in ("base", "adapter"))
        out |= {
            f"{name}_base": prompts(base, n),
            f"{name}_adapter": prompts(adapter, n),
            f"{name}_rise": prompts(adapter - base, n),
            f"{name}_findings": float(len(arm["finding_names"])),
        }
        if arm["cause"] is not None:
            out[f"{name}_named"] = float(arm["finding_names"] == [arm["cause"]])
    return out
