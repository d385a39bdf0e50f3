"""Chapter 8 on a 16 GB card: the cause only a GPU has, vLLM serving the base while the adapter trains.

On a GPU the rollouts come from vLLM in the process, which must receive the LoRA adapter after every
step; when it does not (Unsloth PR 8701) only TRL's `sampling/sampling_logp_difference/mean` shows it.
The recipe turns TRL's importance-sampling correction on so that gap is logged on every GPU run. This
test (skipped without a GPU) trains the book's recipe on Qwen3-4B long enough for the adapter to move
(KL to the base rising) and checks that vLLM's log-probs of its own samples stay with the trainer's:
the adapter reached vLLM, and the doctor names no `rollouts_not_from_policy`. An Unsloth or TRL update
that stops syncing the adapter fails it. The same cause on the CPU is the chapter's unsynced arm
(test_chapter.py); a GPU run cannot break it on purpose: `--rollout-adapter false` is refused with
vLLM sampling, in one line before anything loads (tests/test_lab_settings.py, which runs everywhere).
"""

from __future__ import annotations

import statistics

import pytest

from grpolab.judging.doctor import LOGP_GAP, LOGP_METRIC

from suite import HAS_CUDA, run_into_store

STEPS = 20


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_CUDA,
    reason=(
        "needs a CUDA GPU: trains Qwen3-4B with vLLM in the process for 20 steps and checks that "
        "sampling/sampling_logp_difference/mean stays under the doctor's LOGP_GAP while the KL to the base "
        "rises (the adapter reaches vLLM), and that no rollouts_not_from_policy is named"
    ),
)
def test_on_a_gpu_vllm_samples_from_the_adapter_being_trained(tmp_path):
    client, run = run_into_store(
        f"uv run python labs/grpo-first/train.py --max-steps {STEPS}", tmp_path, "grpo-first"
    )
    assert run.info.status == "FINISHED"
    gap = [m.value for m in client.get_metric_history(run.info.run_id, LOGP_METRIC)]
    kl = [m.value for m in client.get_metric_history(run.info.run_id, "kl")]
    assert len(gap) == STEPS, "TRL's correction is on in the recipe: the gap is logged every step"
    last = gap[-STEPS // 4 :]
    assert statistics.fmean(kl[-STEPS // 4 :]) > statistics.fmean(kl[: STEPS // 4])  # the adapter moved
    assert statistics.fmean(last) < LOGP_GAP, (gap, kl)
    assert "rollouts_not_from_policy" not in run.data.tags["doctor_findings"].split(",")
