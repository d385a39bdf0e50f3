"""Each configuration's budget sheet is read from its verl overrides and says what fits where."""

from __future__ import annotations

import pytest
from grpo_verl import budget
from grpo_verl.settings import load_lab

import budgets

LAB = load_lab()
CONFIGS = sorted(LAB.configs)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_plan_reads_the_overrides(name):
    cfg = LAB.config(name)
    plan = budget.plan(cfg)
    for field, key in budget.PLAN_FROM_VERL.items():
        assert getattr(plan, field) == cfg.verl[key], f"{field} is not {key}"
    assert plan.gpus == cfg.nnodes * cfg.n_gpus_per_node
    assert plan.gpu == cfg.gpu
    completions = cfg.verl["data.train_batch_size"] * cfg.verl["actor_rollout_ref.rollout.n"]
    per_step = plan.per_device_train_batch_size * plan.gpus * plan.gradient_accumulation_steps
    assert per_step == completions  # the sheet's step is verl's step: every rollout of the batch
    assert plan.beta == cfg.verl["actor_rollout_ref.actor.kl_loss_coef"]
    assert (plan.layout, plan.trainer_sharding, plan.load_in_4bit) == ("colocate", "fsdp", False)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_configuration_fits_its_cards(name):
    cfg = LAB.config(name)
    sheet = budget.sheet(cfg)
    assert sheet.fits, sheet.verdict()
    summary = budget.card_summary(cfg, sheet)
    assert summary["cards"].startswith(f"{cfg.nnodes} x {cfg.n_gpus_per_node} ")
    assert summary["layout"].startswith("colocate (fsdp")
    assert summary["peak_per_card_gib"] == round(sheet.total_bytes / 2**30, 2) <= summary["capacity_gib"]
    if cfg.cards > 1:  # one kind of card, each holding an FSDP shard and a vLLM replica
        (card,) = sheet.per_card
        assert card.count == cfg.cards and card.fits


def test_fsdp_shards_the_trainers_state_over_the_cards():
    cfg = LAB.config("one-node")
    one = budgets.compute(budget.plan(cfg).with_(gpus=1, gradient_accumulation_steps=64))
    eight = budget.sheet(cfg)
    assert eight.line("base_weights").bytes * 8 == pytest.approx(one.line("base_weights").bytes, rel=1e-3)
    assert eight.line("vllm_weights").bytes == one.line("vllm_weights").bytes  # one full replica per card


def test_the_one_card_model_is_the_largest_that_fits():
    cfg = LAB.config("one-card")
    assert budget.largest_that_fits(cfg) == cfg.model
    rows = {row["model"]: row for row in budget.candidates(cfg)}
    bigger = budget.QWEN3_BASES[budget.QWEN3_BASES.index(cfg.model) + 1]
    assert rows[cfg.model]["fits"] and not rows[bigger]["fits"]


def test_the_weight_sync_line_and_the_adapter_verl_sends():
    cfg = LAB.config("one-card")
    sheet = budget.sheet(cfg)
    shape = budgets.load_shape(cfg.model)
    assert sheet.metrics["weight_sync_bytes_per_step"] == shape.total_params() * 2  # merged bf16 weights
    text = budget.describe(cfg, sheet)
    adapter_mib = sheet.metrics["trainable_params"] * 2 / 2**20
    assert f"sends the adapter only: {adapter_mib:.1f} MiB" in text
    assert sheet.verdict() in text and sheet.table() in text


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 2),
        ("actor_rollout_ref.actor.fsdp_config.model_dtype", "fp32"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", 32),
    ],
)
def test_settings_the_sheet_cannot_describe_are_refused(key, value):
    cfg = LAB.config("one-node")
    with pytest.raises(budget.BudgetMismatch):
        budget.plan(cfg, {**cfg.verl, key: value})


def test_a_bigger_group_changes_the_sheet():
    cfg = LAB.config("one-card")
    base = budget.sheet(cfg)
    bigger = budget.sheet(
        cfg,
        {
            **cfg.verl,
            "actor_rollout_ref.rollout.n": 16,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
        },
    )
    assert bigger.phases["train"] > base.phases["train"]


@pytest.mark.parametrize("name", CONFIGS)
def test_the_budget_cli_prints_the_same_sheet(name, capsys):
    from budgets.cli import main as budgets_cli

    cfg = LAB.config(name)
    args = budget.cli_args(budget.plan(cfg))
    assert {"--model", "--gpu", "--layout", "--trainer-sharding", "--load-in-4bit"} <= set(args[::2])
    assert ("--gpus" in args[::2]) == (cfg.cards > 1)
    assert budgets_cli(args) == 0
    assert capsys.readouterr().out.strip() == budget.sheet(cfg).table().strip()
    assert f"python -m budgets {' '.join(args)}" in budget.describe(cfg, budget.sheet(cfg))
