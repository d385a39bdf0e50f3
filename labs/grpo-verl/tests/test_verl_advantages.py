"""verl's GRPO and RLOO advantages are the chapter's formulas, and TRL's, on the same group rewards.

The group rewards come from tests/trl_advantages.json: completions the task's rewards scored, and
what TRL 1.15's own advantage lines computed for them (make_trl_fixture.py ran them in the main
environment). The three agree up to two things the formulas name: each library's eps, and float32.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from grpo_verl.advantages import (
    TRL_EPS,
    VERL_EPS,
    group_advantages,
    leave_one_out_advantages,
    verl_advantages,
)
from grpo_verl.reward import compute_score

FIXTURE = json.loads((Path(__file__).parent / "trl_advantages.json").read_text())
CASES = FIXTURE["cases"]
IDS = [f"G{c['num_generations']}" for c in CASES]


def rewards_of(case) -> np.ndarray:
    """The summed rewards as TRL sums them (float32 nansum of the per-function rewards)."""
    return torch.tensor(case["rewards_per_func"], dtype=torch.float32).nansum(dim=1).double().numpy()


def degenerate(case) -> np.ndarray:
    """Completions whose group scored all alike: there the std is 0 and only rounding is left."""
    r = rewards_of(case).reshape(-1, case["num_generations"])
    return np.repeat(r.max(axis=1) == r.min(axis=1), case["num_generations"])


def test_the_fixture_is_trls_and_covers_what_matters():
    assert FIXTURE["trl_version"].startswith("1.15")
    assert {c["num_generations"] for c in CASES} >= {2, 8}
    assert any(degenerate(c).any() for c in CASES) and all((~degenerate(c)).any() for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_verls_reward_path_gives_trls_rewards(case):
    rows = [
        compute_score(FIXTURE["task"], text, target, {})
        for text, target in zip(case["completions"], case["targets"], strict=True)
    ]
    got = [[row[name] for name in case["reward_funcs"]] for row in rows]
    np.testing.assert_array_equal(np.float32(got), np.float32(case["rewards_per_func"]))


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_verls_estimators_are_the_chapters_formulas(case, dtype):
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    g, r = case["num_generations"], rewards_of(case)
    index = np.array([f"p{i // g}" for i in range(r.size)], dtype=object)
    rewards = torch.tensor(r, dtype=dtype)[:, None]
    mask = torch.ones_like(rewards)
    formulas = {
        ("grpo", True): group_advantages(r, g, scale_by_std=True, eps=VERL_EPS),
        ("grpo", False): group_advantages(r, g, scale_by_std=False),
        ("rloo", None): leave_one_out_advantages(r, g),
    }
    for (name, norm), want in formulas.items():
        for variant in (name, f"{name}_vectorized"):
            kwargs = {} if norm is None else {"norm_adv_by_std_in_grpo": norm}
            adv, _ = get_adv_estimator_fn(variant)(rewards.clone(), mask, index, **kwargs)
            got = adv[:, 0].double().numpy()
            # The vectorized variants compute in float32 whatever they are given (verl/utils/groupwise.py).
            if dtype == torch.float64 and not variant.endswith("_vectorized"):
                np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=f"{variant} {norm}")
            else:
                assert_float32_close(
                    got, want, case, scaled=bool(norm), eps=VERL_EPS, label=f"{variant} {norm}"
                )


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_verls_driver_computes_the_chapters_advantages(case):
    """Through compute_advantage_for_multi_trajectories, the function verl's trainer step calls."""
    g, r = case["num_generations"], rewards_of(case)
    got = {
        "grpo": verl_advantages(r, g, "grpo", norm_adv_by_std_in_grpo=True),
        "dr_grpo": verl_advantages(r, g, "grpo", norm_adv_by_std_in_grpo=False),
        "rloo": verl_advantages(r, g, "rloo"),
    }
    assert_float32_close(got["grpo"], group_advantages(r, g, True, VERL_EPS), case, True, VERL_EPS, "grpo")
    assert_float32_close(got["dr_grpo"], group_advantages(r, g, False), case, False, VERL_EPS, "dr_grpo")
    assert_float32_close(got["rloo"], leave_one_out_advantages(r, g), case, False, VERL_EPS, "rloo")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_trls_advantages_are_the_chapters_formulas(case):
    g, r = case["num_generations"], rewards_of(case)
    trl = case["grpo_advantages"]
    assert_float32_close(
        np.array(trl["group"]), group_advantages(r, g, True, TRL_EPS), case, True, TRL_EPS, "trl group"
    )
    assert_float32_close(
        np.array(trl["none"]), group_advantages(r, g, False), case, False, TRL_EPS, "trl none"
    )
    rloo = np.array(case["rloo_advantages"])
    assert_float32_close(rloo, leave_one_out_advantages(r, g), case, False, TRL_EPS, "trl rloo")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_verl_and_trl_differ_only_by_their_eps(case):
    g, r = case["num_generations"], rewards_of(case)
    live = ~degenerate(case)
    verl = verl_advantages(r, g, "grpo", norm_adv_by_std_in_grpo=True)
    trl = np.array(case["grpo_advantages"]["group"])
    predicted = group_advantages(r, g, True, VERL_EPS) - group_advantages(r, g, True, TRL_EPS)
    np.testing.assert_allclose((verl - trl)[live], predicted[live], atol=2e-6)
    assert np.abs(predicted[live]).max() > 1e-5  # the eps gap is visible, so the check above can fail
    # Without the std (Dr. GRPO) and with the leave-one-out baseline there is no eps: the same numbers.
    np.testing.assert_allclose(
        verl_advantages(r, g, "grpo", False), case["grpo_advantages"]["none"], atol=1e-6
    )
    np.testing.assert_allclose(verl_advantages(r, g, "rloo"), case["rloo_advantages"], atol=1e-6)


def assert_float32_close(got, want, case, scaled: bool, eps: float, label: str):
    """Equal to float32 precision. In a group whose rewards are all alike the formula gives 0, but a
    float32 mean can miss the common value by one unit in the last place (ulp); scaled by the std it
    becomes at most ~ulp/(std + eps) with std of the same order: the bound checked there."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    live = ~degenerate(case)
    np.testing.assert_allclose(got[live], want[live], rtol=1e-5, atol=1e-6, err_msg=label)
    ulp = np.spacing(np.float32(np.abs(rewards_of(case)).max()))
    bound = (2 * ulp / eps) if scaled else 2 * ulp
    assert np.abs(got[~live]).max(initial=0) <= bound, f"{label}: a uniform group's advantage exceeds {bound}"
    np.testing.assert_array_equal(want[~live], 0.0)
