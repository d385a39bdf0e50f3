"""The run doctor: from what TRL logged and the held-out evaluation, what held learning back.

Each finding names the problem with the run's own numbers and one next step, as flags the lab
accepts. The signs it reads, all logged by TRL every step:

    frac_reward_zero_std         groups whose completions all scored the same: no advantage, no signal
    completions/clipped_ratio    completions cut at max_completion_length: the answer never came
    kl                           distance from the reference policy (beta > 0)
    entropy                      how spread the policy's sampling still is
    rewards/<fn>/mean            each reward; a shaping reward up while an answer reward falls is
                                 reward hacking

and the held-out accuracy before and after training (grpolab.evaluate). Which rewards there are, the
most each pays and its role (answer or shaping) come from the run's task (`values["task"]`), as
declared in task.rewards, so every rule reads a reward as soon as a task declares it.

A run may train on rewards its task does not declare (`reward_funcs`, with TRL's `reward_weights`):
chapter 4 trains on a loose checker and keeps the task's exact rewards beside it at weight 0, logged
on the same completions but paying nothing. A trained answer reward that is not the task's own is a
proxy; when it climbs away from the task's exact answer reward on the same completions, or while
held-out accuracy does not rise, the policy is paid for something other than the right answer, and
the doctor names the step where the two parted.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from budgets.advice import lower, raise_, render
from task import get_task
from task.rewards import RewardFunc, RewardInfo, RewardRole, reward_info

# Thresholds, each a judgement call stated once.
NO_SIGNAL_SHARE = 0.3  # a third of the groups teaching nothing is a run mostly spent idle
CLIPPED_SHARE = 0.25  # a quarter of completions cut short
KL_RISE = 2.0  # the last quarter's KL at least twice the second quarter's ...
KL_FLOOR = 0.5  # ... and large in absolute terms (nats per token)
ENTROPY_FALL = 0.25  # the last quarter's entropy under a quarter of the first's
FLAT_SHARE = 0.02  # a reward moved by less than 2% of the most it pays
LOW_REWARD = 0.05  # a mean reward at or below this: most completions earn nothing at all
RARE_CORRECT = 0.01  # answer rewards paid this share of their maximum on average: the answer is out of reach
# A proxy answer reward paying at least this share of its maximum more than the task's exact answer
# reward, beyond the gap they started with: a fifth of the completions paid for a wrong answer.
PROXY_GAP = 0.2
REWARD_METRIC = re.compile(r"rewards/(.+)/mean")


@dataclass(frozen=True)
class Finding:
    name: str
    message: str  # the numbers and the next step, one line

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"


def step_rows(history: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """The rows TRL logs once per step (not the end-of-training summary)."""
    # Any reward's mean marks a step row, whatever the task: the summary row logs none of them.
    return [row for row in history if "loss" in row or any(REWARD_METRIC.fullmatch(k) for k in row)]


def series(history: Sequence[dict[str, float]], key: str) -> list[float]:
    return [row[key] for row in history if key in row]


def run_rewards(
    values: Mapping[str, Any], reward_funcs: Sequence[RewardFunc] | None = None
) -> tuple[RewardInfo, ...]:
    """The declared rewards the run was trained on: `reward_funcs` if given, else `values["task"]`'s."""
    if reward_funcs is None:
        if values.get("task") is None:
            # No guess: every threshold scales with the rewards' maxima, and a wrong task's rewards
            # would give confident, wrong verdicts (or none) instead of an error.
            raise ValueError("the run doctor needs the run's task: values['task'], or reward_funcs=")
        reward_funcs = get_task(values["task"]).reward_funcs
    return tuple(reward_info(f) for f in reward_funcs)


def _trend(rows: Sequence[dict[str, float]], reward: RewardInfo) -> tuple[float, float] | None:
    """A reward's first and last quarter means, None if it was never logged."""
    values = series(rows, reward.metric)
    if not values:
        return None
    first, _, _, last = quarters(values)
    return first, last


def no_signal(rows: Sequence[dict[str, float]]) -> list[float]:
    """Per step, the share of groups whose completions all scored the same. TRL's own
    frac_reward_zero_std misses groups whose std is a float's rounding away from zero (16 rewards of
    0.2 give 1.5e-8, above torch.isclose's 1e-8), so a step whose reward_std is that small counts too."""
    out = []
    for row in rows:
        share = row.get("frac_reward_zero_std")
        if share is None:
            continue
        out.append(1.0 if row.get("reward_std", 1.0) < 1e-6 else share)
    return out


def quarters(values: list[float]) -> tuple[float, float, float, float]:
    """Mean of each quarter of a series (short series repeat their values)."""
    n = len(values)
    cuts = [values[i * n // 4 : max((i + 1) * n // 4, i * n // 4 + 1)] for i in range(4)]
    return tuple(statistics.fmean(c) for c in cuts)  # type: ignore[return-value]


def diagnose(
    history: Sequence[dict[str, float]],
    values: Mapping[str, Any],
    accepts: set[str],
    before=None,
    after=None,
    *,
    reward_funcs: Sequence[RewardFunc] | None = None,
    reward_weights: Sequence[float] | None = None,
) -> list[Finding]:
    """The findings for one run. `values`: the run's settings (what advice is rendered against, and
    `values["task"]`, whose rewards are read); `accepts`: the settings the lab's command line accepts;
    `before`/`after`: held-out results; `reward_funcs`: the rewards, when not the task's;
    `reward_weights`: TRL's weights of those rewards (a reward at weight 0 is watched, not trained)."""
    logged = run_rewards(values, reward_funcs)  # before any early return: a bad call fails on every run
    weights = [1.0] * len(logged) if reward_weights is None else [float(w) for w in reward_weights]
    if len(weights) != len(logged):
        raise ValueError(f"{len(weights)} reward weights for {len(logged)} rewards")
    rewards = [r for r, w in zip(logged, weights, strict=True) if w != 0]  # what the policy was paid
    rows = step_rows(history)
    findings: list[Finding] = []
    if len(rows) < MIN_STEPS:
        return findings
    most = sum(w * r.max_reward for r, w in zip(logged, weights, strict=True))
    answers = [r for r in rewards if r.role is RewardRole.ANSWER]
    shaping = [r for r in rewards if r.role is RewardRole.SHAPING]

    def advise(*changes) -> str:
        return render(tuple(changes), values, accepts)

    flat = no_signal(rows)
    reward = series(rows, "reward")
    if flat and statistics.fmean(flat) >= NO_SIGNAL_SHARE:
        idle = sum(1 for f in flat if f >= 0.999)
        level = statistics.fmean(reward) if reward else 0.0
        paid = {r: statistics.fmean(s) for r in answers if (s := series(rows, r.metric))}
        harder = "pick a harder task with --task" if "task" in accepts else "pick a harder task"
        if level >= 0.9 * most:
            why, fix = "the task is too easy for the policy", harder
        elif level > LOW_REWARD and paid and all(m < RARE_CORRECT * r.max_reward for r, m in paid.items()):
            why = (
                f"completions earn the format and almost never the answer (correctness "
                f"{', '.join(f'{m:.3f}' for m in paid.values())} on average in "
                f"{', '.join(r.metric for r in paid)}): the policy has little left it can learn"
            )
            fix = advise(raise_("num_generations"), raise_("temperature")) + ", or an easier task"
        elif level <= LOW_REWARD:
            why = "most groups scored nothing"
            fix = advise(raise_("num_generations"), raise_("temperature"))
        else:
            why = "too many groups are all right or all wrong together"
            fix = advise(raise_("num_generations"), raise_("temperature"))
        findings.append(
            Finding(
                "no_learning_signal",
                f"in {statistics.fmean(flat):.0%} of groups every completion scored the same ({idle} of "
                f"{len(flat)} steps had no signal at all; mean reward {level:.3f}): {why}: {fix}",
            )
        )

    clipped = series(rows, "completions/clipped_ratio")
    if clipped and statistics.fmean(clipped) >= CLIPPED_SHARE:
        findings.append(
            Finding(
                "completions_cut",
                f"{statistics.fmean(clipped):.0%} of completions were cut at max_completion_length "
                f"{values.get('max_completion_length')} ({quarters(clipped)[3]:.0%} in the last quarter): the "
                f"answer never came: {advise(raise_('max_completion_length'))}, or penalise length",
            )
        )

    kl = series(rows, "kl")
    if kl:
        _, second, _, last = quarters(kl)
        if last >= KL_FLOOR and last >= KL_RISE * max(second, 1e-9):
            findings.append(
                Finding(
                    "kl_climbing",
                    f"KL to the reference rose from {second:.3f} (second quarter) to {last:.3f} (last quarter): "
                    f"the policy is drifting fast: {advise(lower('learning_rate'), raise_('beta'))}",
                )
            )

    entropy = series(rows, "entropy")
    if entropy:
        first, _, _, last = quarters(entropy)
        if first > 0 and last < ENTROPY_FALL * first:
            findings.append(
                Finding(
                    "entropy_collapsed",
                    f"entropy fell from {first:.3f} to {last:.3f}: the policy samples nearly one completion "
                    f"per prompt, so groups stop differing: {advise(raise_('temperature'), lower('learning_rate'))}",
                )
            )

    eval_fell = before is not None and after is not None and after.accuracy < before.accuracy
    # Each reward's moves are judged against the most it pays: a 0.004 rise is noise for a 1.0 reward
    # and 2% of a 0.2 one.
    rose = [(r, t) for r in shaping if (t := _trend(rows, r)) and t[1] > t[0] + FLAT_SHARE * r.max_reward]
    answered = [(r, t) for r in answers if (t := _trend(rows, r))]
    fell = [(r, t) for r, t in answered if t[1] < t[0] - FLAT_SHARE * r.max_reward]
    if rose and (fell or eval_fell):
        # When only the held-out accuracy fell, the answer rewards' flat trends are shown beside it.
        clauses = [f"{r.metric} went {t[0]:.3f} -> {t[1]:.3f}" for r, t in (fell or answered)]
        if eval_fell:
            clauses.append(f"held-out accuracy {before.accuracy:.1%} -> {after.accuracy:.1%}")
        findings.append(
            Finding(
                "reward_hacking",
                f"{' and '.join(f'{r.metric} rose {t[0]:.3f} -> {t[1]:.3f}' for r, t in rose)} while "
                f"{', '.join(clauses)}: the policy learns the format, not the task: "
                f"{advise(lower('learning_rate'), raise_('beta'))}, and check the rewards pay only right answers",
            )
        )

    findings += _proxy_hacking(rows, values, rewards, before, after)

    if reward and not any(f.name == "no_learning_signal" for f in findings):
        first, _, _, last = quarters(reward)
        improved = after is not None and before is not None and after.accuracy > before.accuracy
        if abs(last - first) < FLAT_SHARE * most and not improved:
            findings.append(
                Finding(
                    "reward_flat",
                    f"the reward stayed at {first:.3f} -> {last:.3f} (first and last quarter) over {len(reward)} "
                    f"steps: {advise(raise_('learning_rate'), raise_('max_steps'))}",
                )
            )

    declared = {r.metric for r in logged}
    undeclared = sorted({k for row in rows for k in row if REWARD_METRIC.fullmatch(k)} - declared)
    if undeclared:
        # Reported, not guessed at: with no maximum or role no rule can read it, and the run's maximum
        # reward (what "flat" and "too easy" are measured against) leaves its payout out.
        findings.append(
            Finding(
                "undeclared_reward",
                f"{', '.join(undeclared)} logged, but the run's task declares only "
                f"{', '.join(sorted(declared))}: no rule read it: declare it in the task's reward_funcs "
                f"with task.rewards.declare_reward",
            )
        )
    return findings


MIN_STEPS = 4  # fewer logged steps than this tell nothing about a trend


def _proxy_hacking(
    rows: Sequence[dict[str, float]], values: Mapping[str, Any], trained: Sequence[RewardInfo], before, after
) -> list[Finding]:
    """reward_hacking by a proxy: a trained answer reward the task does not declare rose, while the
    task's exact answer reward on the same completions (logged at weight 0) fell behind it, or, when
    it was not logged, while held-out accuracy did not rise. Names the step the two parted."""
    if values.get("task") is None:
        return []
    own = get_task(values["task"]).rewards
    exact = [r for r in own if r.role is RewardRole.ANSWER]
    proxies = [r for r in trained if r.role is RewardRole.ANSWER and r.name not in {o.name for o in own}]
    held_out_rose = before is not None and after is not None and after.accuracy > before.accuracy
    held_out = (
        f", and held-out accuracy went {before.accuracy:.1%} -> {after.accuracy:.1%}"
        if before is not None and after is not None
        else ""
    )
    findings = []
    for proxy in proxies:
        paid = series(rows, proxy.metric)
        trend = _trend(rows, proxy)
        # A proxy that held its level while the exact reward fell is hacking too (measured: a loose
        # checker that needs no tag kept paying while the policy dropped the tag and its accuracy).
        if trend is None or trend[1] < trend[0] - FLAT_SHARE * proxy.max_reward:
            continue
        rose = trend[1] > trend[0] + FLAT_SHARE * proxy.max_reward
        watched = next((r for r in exact if series(rows, r.metric)), None)
        if watched is not None:
            truth = series(rows, watched.metric)
            n = min(len(paid), len(truth))
            gap = [paid[i] / proxy.max_reward - truth[i] / watched.max_reward for i in range(n)]
            first, _, _, last = quarters(gap)
            if last - first < PROXY_GAP:
                continue
            start = onset(gap, [row.get("step", i + 1) for i, row in enumerate(rows) if proxy.metric in row])
            t = _trend(rows, watched)
            what = (
                f"from step {start:g} {proxy.metric} {'rose' if rose else 'held'} {trend[0]:.3f} -> {trend[1]:.3f} "
                f"while the task's own "
                f"check on the same completions, {watched.metric}, went {t[0]:.3f} -> {t[1]:.3f}{held_out}"
            )
        elif rose and not held_out_rose and held_out:
            what = f"{proxy.metric} rose {trend[0]:.3f} -> {trend[1]:.3f}{held_out}"
        else:
            continue
        names = ", ".join(r.name for r in exact)
        findings.append(
            Finding(
                "reward_hacking",
                f"{what}: {proxy.name} pays completions the task calls wrong: train on the task's own "
                f"{names} instead (score a few completions by both to see what {proxy.name} pays for)",
            )
        )
    return findings


def onset(gap: Sequence[float], steps: Sequence[float]) -> float:
    """The step where a gap that widened over a run began to widen: the first whose window of the
    next tenth of the run (at least 2 steps) averages a quarter of the way from the first quarter's
    level to the last quarter's (a window, so one lucky step does not start it)."""
    first, _, _, last = quarters(list(gap))
    begun = first + (last - first) / 4
    width = max(2, len(gap) // 10)
    for i in range(len(gap)):
        if statistics.fmean(gap[i : i + width]) >= begun:
            return steps[i]
    return steps[-1]


def verdict(findings: list[Finding], before=None, after=None, steps: int | None = None) -> str:
    """One paragraph for the summary and the run's description."""
    if steps is not None and steps < MIN_STEPS:
        return f"Run doctor: {steps} logged step(s) are too few to read a trend from (it needs {MIN_STEPS})."
    held_out = ""
    if before is not None and after is not None:
        held_out = (
            f" Held-out accuracy {before.accuracy:.1%} -> {after.accuracy:.1%}, format "
            f"{before.format_rate:.1%} -> {after.format_rate:.1%} (base -> adapter)."
        )
    if not findings:
        return "Run doctor: nothing held learning back." + held_out
    return f"Run doctor: {len(findings)} finding(s).{held_out} " + " ".join(f"[{f}]" for f in findings)
