"""What chapter 1 claims of its CPU run (the README's command on the stand-in), checked by its tests on
the suite's run and by `uv run python -m grpolab.matrix` on every seed and emulated machine.

The book's first run: the correctness reward climbs as the policy learns to put the sum it knows in
the tag, and held-out accuracy (greedy, prompts disjoint from training) rises with it; the format is
learned on the way; the run doctor finds nothing that held learning back. Held-out figures are
counted in prompts (of 64): one prompt is 1.6 points, and a claim's margin is read in prompts.
"""

from __future__ import annotations

from grpolab.judging.claims import ChapterStore, Claim, prompts, quarter_means

CLAIMS = (
    Claim("correctness_reward climbs, first quarter to last", "correctness_climb", at_least=0.30),
    Claim(
        "held-out accuracy rises by at least a quarter of the prompts (16 of 64)",
        "held_out_rise",
        at_least=16,
    ),
    Claim("the adapter answers in the tag on most held-out prompts", "adapter_format", at_least=48),
    Claim("the run doctor finds nothing that held learning back", "doctor_findings", at_most=0),
)


def figures(book: ChapterStore) -> dict[str, float]:
    run = book.only("train")
    n = int(run.data.params["eval_prompts"])
    first, last = quarter_means(book.history(run, "rewards/correctness_reward/mean"))
    m = run.data.metrics
    findings = run.data.tags.get("doctor_findings", "none")
    return {
        "finished": float(run.info.status == "FINISHED"),
        "correctness_first": first,
        "correctness_last": last,
        "correctness_climb": last - first,
        "held_out_base": prompts(m["eval/base_accuracy"], n),
        "held_out_adapter": prompts(m["eval/adapter_accuracy"], n),
        "held_out_rise": prompts(m["eval/adapter_accuracy"] - m["eval/base_accuracy"], n),
        "adapter_format": prompts(m["eval/adapter_format_rate"], n),
        "doctor_findings": float(0 if findings == "none" else len(findings.split(","))),
    }
