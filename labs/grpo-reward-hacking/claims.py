"""What chapter 4 claims of its CPU run (the README's command: every arm from the same start), checked
by its tests on the suite's run and by `uv run python -m grpolab.matrix` on every seed.

The lesson: the honest reward learns and the loose one hacks. The exact arm's held-out accuracy rises
and the doctor names nothing; under the loose checker with the book's leash or none, held-out accuracy
falls while the paid reward climbs, and the doctor names `reward_hacking`; ten times the book's beta
keeps most of what the base knew. Held-out figures are counted in prompts (of 64).
"""

from __future__ import annotations

import tempfile

from grpolab.judging.claims import ChapterStore, Claim, prompts, quarter_means

LOOSE = ("loose", "loose-beta0")  # the arms the loose checker pays with the book's leash, or none
CLAIMS = (
    Claim(
        "the exact arm's held-out accuracy rises by at least 10 points (7 of 64 prompts)",
        "exact_rise",
        at_least=7,
    ),
    Claim("the doctor names no hack on the exact arm", "exact_hack", at_most=0),
    *(Claim(f"the {arm} arm's held-out accuracy falls", f"{arm}_fall", at_least=1) for arm in LOOSE),
    *(Claim(f"the {arm} arm's paid reward climbs", f"{arm}_paid_climb", at_least=0.2) for arm in LOOSE),
    *(Claim(f"the doctor names reward_hacking on the {arm} arm", f"{arm}_hack", at_least=1) for arm in LOOSE),
    Claim(
        "held out, the loose checker pays the loose arm's adapter for at least 13 of 64 prompts more than the "
        "exact reward does: the trick generalises",
        "loose_trick",
        at_least=13,
    ),
    Claim("beta 0.2 keeps at least half of the base's right answers", "loose-beta0.2_kept", at_least=0.5),
    Claim("beta 0.2 keeps at least 7 of 64 prompts more than the book's beta", "leash_kept_more", at_least=7),
    Claim(
        "beta 0.2 keeps the drift (KL, last quarter) under 0.8 of the book's beta's",
        "leash_kl_share",
        at_most=0.8,
    ),
)


def figures(book: ChapterStore) -> dict[str, float]:
    parent = book.only("arms")
    with tempfile.TemporaryDirectory() as folder:
        arms = {a["arm"]: a for a in book.artifact_json(parent, "arms/arms.json", folder)["arms"]}
    n = int(book.children(parent)[0].data.params["eval_prompts"])
    out = {"finished": float(parent.info.status == "FINISHED")}
    for name, arm in arms.items():
        base, adapter = (arm["held_out"][which]["accuracy"] for which in ("base", "adapter"))
        first, last = quarter_means(arm["paid"])
        out |= {
            f"{name}_base": prompts(base, n),
            f"{name}_adapter": prompts(adapter, n),
            f"{name}_rise": prompts(adapter - base, n),
            f"{name}_fall": prompts(base - adapter, n),
            f"{name}_kept": adapter / base if base else 0.0,
            f"{name}_paid_climb": last - first,
            f"{name}_hack": float("reward_hacking" in arm["finding_names"]),
        }
        paid_held_out = arm["held_out"]["adapter"]["rewards"].get("contains_answer_reward")
        if paid_held_out is not None:
            out[f"{name}_trick"] = prompts(paid_held_out - adapter, n)
    book, tight = arms["loose"], arms["loose-beta0.2"]
    out["leash_kept_more"] = out["loose-beta0.2_adapter"] - out["loose_adapter"]
    out["leash_kl_share"] = quarter_means(tight["kl"])[1] / quarter_means(book["kl"])[1]
    return out
