"""Regenerate tests/trl_advantages.json: TRL's own advantage lines, run on the task's group rewards.

TRL is not in verl's environment, so the test that holds verl's advantages against TRL's reads what
this script wrote. It runs in the repository's main environment (TRL 1.15), from the root:

    uv run python labs/grpo-verl/make_trl_fixture.py

Nothing is copied from TRL: the script takes the advantage block out of the installed
GRPOTrainer._generate_and_score_completions and RLOOTrainer._generate_and_score_completions (from
``unscorable_mask = ...`` to ``advantages = torch.nan_to_num(...)``) and runs it on rewards that the
task's own reward functions gave to completions, called as TRL calls them. A TRL upgrade that moves
or renames those lines makes this script fail instead of writing something else.
"""

from __future__ import annotations

import inspect
import json
import random
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

START = "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)"
END = "advantages = torch.nan_to_num(advantages, nan=0.0)"
FIXTURE = Path(__file__).resolve().parent / "tests" / "trl_advantages.json"
# (group size, number of groups): GRPO's usual 8, a small 4, and the smallest group, 2.
CASES = ((8, 6), (4, 4), (2, 3))


def trl_block(method) -> tuple[str, str]:
    """The advantage lines of a TRL method, dedented, and where they are."""
    lines, first = inspect.getsourcelines(method)
    stripped = [line.strip() for line in lines]
    if stripped.count(START) != 1 or END not in stripped:
        raise SystemExit(f"{method.__qualname__}: the advantage block moved in this TRL; update START/END")
    start = stripped.index(START)
    end = stripped.index(END, start)
    import trl

    site = Path(trl.__file__).parent.parent  # the path as it reads in any environment: trl/trainer/...
    where = f"{Path(inspect.getsourcefile(method)).relative_to(site)}:{first + start}-{first + end}"
    return textwrap.dedent("".join(lines[start : end + 1])), where


def run_block(code: str, rewards_per_func, num_generations: int, **trainer_attrs):
    import torch
    from trl.trainer.utils import nanstd

    names = {
        "torch": torch,
        "nanstd": nanstd,
        "device": "cpu",
        "rewards_per_func": rewards_per_func,
        "num_generations": num_generations,
        "self": SimpleNamespace(reward_weights=torch.ones(rewards_per_func.shape[1]), **trainer_attrs),
    }
    exec(code, names)
    return names["advantages"]


def completions_for(target: int, rng: random.Random) -> str:
    """A completion the task scores 1.2, 0.2 or 0: right, wrong, untagged, or tagged twice."""
    kind = rng.choices(["right", "wrong", "untagged", "twice"], weights=[3, 3, 2, 1])[0]
    return {
        "right": f"<ans>{target}</ans>",
        "wrong": f"<ans>{target + 1}</ans>",
        "untagged": f"The sum is {target}.",
        "twice": f"<ans>{target}</ans> or <ans>{target}</ans>",
    }[kind]


def main() -> int:
    import torch
    import trl
    from trl import GRPOTrainer, RLOOTrainer

    from task import get_task

    task = get_task("addition")
    grpo_code, grpo_where = trl_block(GRPOTrainer._generate_and_score_completions)
    rloo_code, rloo_where = trl_block(RLOOTrainer._generate_and_score_completions)
    rng = random.Random(0)
    cases = []
    for group_size, groups in CASES:
        rows = task.build_dataset(groups, seed=group_size)
        texts, targets = [], []
        for g, row in enumerate(rows):
            group = [completions_for(row["target"], rng) for _ in range(group_size)]
            if g == 0:  # one group where every completion scores the same: std 0, advantage 0
                group = [f"<ans>{row['target']}</ans>"] * group_size
            texts += group
            targets += [row["target"]] * group_size
        # As TRL calls reward functions on conversational data: one assistant message per completion.
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        prompts = [row["prompt"] for row in rows for _ in range(group_size)]
        per_func = [fn(prompts=prompts, completions=completions, target=targets) for fn in task.reward_funcs]
        rewards_per_func = torch.tensor(list(zip(*per_func, strict=True)), dtype=torch.float32)
        grpo = {
            scale: run_block(
                grpo_code,
                rewards_per_func,
                group_size,
                multi_objective_aggregation="sum_then_normalize",
                scale_rewards=scale,
            ).tolist()
            for scale in ("group", "none")
        }
        rloo = run_block(
            rloo_code,
            rewards_per_func,
            group_size,
            reward_clip_range=None,
            beta=0.0,
            normalize_advantages=False,
        ).tolist()
        cases.append(
            {
                "num_generations": group_size,
                "completions": texts,
                "targets": targets,
                "reward_funcs": [fn.__name__ for fn in task.reward_funcs],
                "rewards_per_func": rewards_per_func.tolist(),
                "grpo_advantages": grpo,
                "rloo_advantages": rloo,
            }
        )
    fixture = {
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "task": task.name,
        "source": {"grpo": grpo_where, "rloo": rloo_where},
        "settings": {
            "grpo": "multi_objective_aggregation='sum_then_normalize', reward_weights 1; "
            "scale_rewards 'group' (GRPO) and 'none' (Dr. GRPO)",
            "rloo": "normalize_advantages=False, beta=0, no reward clipping",
        },
        "regenerate": "uv run python labs/grpo-verl/make_trl_fixture.py  (in the main environment)",
        "cases": cases,
    }
    FIXTURE.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {FIXTURE} (TRL {trl.__version__}, {sum(len(c['targets']) for c in cases)} completions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
