"""Score completions through verl's own reward path, on CPU, as its reward workers do in a run.

In a run, verl's agent loop sends each finished rollout (prompt and response token ids, the row's
data_source, reward_model and extra_info) to a RewardLoopWorker Ray actor. The worker decodes the
response, calls the configured ``compute_score`` (loaded from ``reward.custom_reward_function.path``)
and its reward manager puts the score on the response's last token (``rm_scores``). `verl_scores` runs
that same worker class in-process, in a thread with an event loop of its own (the worker binds the
current loop when built; a notebook's kernel already runs one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def rollout_batch(
    tokenizer, prompts: Sequence[str], responses: Sequence[str], rows: Sequence[Mapping[str, Any]]
):
    """A DataProto shaped like a rollout's: left-padded prompts, right-padded responses ending in EOS."""
    import numpy as np
    import torch
    from verl import DataProto

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    p_ids = [ids(p) for p in prompts]
    r_ids = [[*ids(r), tokenizer.eos_token_id] for r in responses]
    p_len, r_len, pad = max(map(len, p_ids)), max(map(len, r_ids)), tokenizer.pad_token_id
    tensors: dict[str, list] = {"prompts": [], "responses": [], "attention_mask": []}
    for p, r in zip(p_ids, r_ids, strict=True):
        tensors["prompts"].append([pad] * (p_len - len(p)) + p)
        tensors["responses"].append(r + [pad] * (r_len - len(r)))
        tensors["attention_mask"].append(
            [0] * (p_len - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_len - len(r))
        )
    non_tensors = {
        key: np.array([row[key] for row in rows], dtype=object) for key in ("data_source", "reward_model")
    }
    non_tensors["extra_info"] = np.array([dict(row.get("extra_info") or {}) for row in rows], dtype=object)
    return DataProto.from_dict(
        tensors={k: torch.tensor(v) for k, v in tensors.items()}, non_tensors=non_tensors
    )


def verl_scores(config, batch) -> tuple[list[dict[str, Any]], Any]:
    """verl's per-completion outputs ({reward_score, reward_extra_info}) and the rm_scores tensor."""

    def run():
        import asyncio
        import copy

        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker, migrate_legacy_reward_impl
        from verl.trainer.ppo.reward import resolve_reward_manager_cls

        asyncio.set_event_loop(asyncio.new_event_loop())
        prepared = migrate_legacy_reward_impl(copy.deepcopy(config))  # as verl's trainer prepares it
        worker = RewardLoopWorker(prepared)
        try:
            outputs = worker.loop.run_until_complete(worker.compute_score_batch(batch))
        finally:
            worker.loop.close()
        manager = resolve_reward_manager_cls(prepared)
        return outputs, manager.assemble_rm_scores(batch, [o["reward_score"] for o in outputs])

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()
