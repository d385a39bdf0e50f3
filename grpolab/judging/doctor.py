"""The run doctor: from what TRL logged and the held-out evaluation, what held learning back.

Each finding names the problem with the run's own numbers and one next step, as flags the lab
accepts. The signs it reads, all logged by TRL every step:

    frac_reward_zero_std         groups whose completions all scored the same: no advantage, no signal
    completions/clipped_ratio    completions cut at max_completion_length: the answer never came
    kl                           distance from the reference policy (beta > 0)
    entropy                      how spread the policy's sampling still is
    rewards/<fn>/mean            each reward; a shaping reward up while an answer reward falls is
                                 reward hacking
    sampling/sampling_logp_difference/mean
                                 vLLM's log-probs of its own samples against the trainer's (GPU, with
                                 vllm_importance_sampling_correction): a gap that grows as the adapter
                                 trains says the rollouts are not the adapter's

two the harness adds from the completions themselves (grpolab.judging.completions.group_stats):

    completions/distinct_share   how many of a group's completions differ (1/G: all the same)
    completions/tag_like_ratio   how many hold something that looks like the answer tag

and the held-out accuracy before and after training (grpolab.judging.evaluate). The book names four reasons a
correctness curve never moves, and each has a rule: completions cut before the tag
(`cut_before_the_tag`), a group with no diversity (`no_diversity`: the temperature), a reward whose
parse fails on every completion (`reward_never_pays`), and rollouts that do not come from the policy
being trained (`rollouts_not_from_policy`: the adapter not in vLLM; Unsloth PR 8701). Which rewards there are, the
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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from budgets.advice import lower, raise_, render, set_to
from task import get_task
from task.rewards import RewardFunc, RewardInfo, RewardRole, reward_info

# Thresholds, each a judgement call stated once.
NO_SIGNAL_SHARE = 0.3  # a third of the groups teaching nothing is a run mostly spent idle
CLIPPED_SHARE = 0.25  # a quarter of completions cut short
KL_RISE = 2.0  # the last quarter's KL at least twice the second quarter's ...
KL_FLOOR = 0.5  # ... and large in absolute terms (nats per token)
ENTROPY_FALL = 0.25  # the last quarter's entropy under a quarter of the first's
FLAT_SHARE = 0.02  # a reward moved by less than 2% of the most it pays
SOLVED = 0.9  # a mean reward at this share of the most a completion earns: the policy already solves it
LOW_REWARD = 0.05  # a mean reward at or below this: most completions earn nothing at all
RARE_CORRECT = 0.01  # answer rewards paid this share of their maximum on average: the answer is out of reach
# A proxy answer reward paying at least this share of its maximum more than the task's exact answer
# reward, beyond the gap they started with: a fifth of the completions paid for a wrong answer.
PROXY_GAP = 0.2
CUT_FORMAT_SHARE = (
    0.5  # cut completions with the format paid to fewer than half of all completions: cut before the tag
)
NO_DIVERSITY = (
    1.5  # distinct completions in a group, on average over the first quarter: one, now and then two
)
TAG_LIKE = (
    0.05  # one completion in twenty holds an answer in its tag while a reward pays none: its parse fails
)
# vLLM's log-probs against the trainer's, per token: kernels and precision keep the two within a few
# hundredths of a nat when they are the same model; a rollout engine serving the base while the adapter
# trains drifts with the adapter, as far as the KL to the base.
LOGP_GAP = 0.1  # nats per token in the last quarter ...
LOGP_GROWTH = 3.0  # ... and that many times the first quarter's
LOGP_METRIC = "sampling/sampling_logp_difference/mean"
# The findings that read what the policy learned from its rollouts (its rewards' trends, its KL and
# entropy): set aside while the rollouts come from another policy, and when it never left its start.
LEARNED_READINGS = ("kl_climbing", "entropy_collapsed", "reward_hacking")
# A group with no spread is sampled at TRL's default temperature, the book's recipe's: the one the
# doctor names with its advice, so the advice is a value a run can take, not a direction.
DIVERSE_TEMPERATURE = 1.0
# A policy that never left its start: KL to the reference under this in the last quarter (nats per
# token) while nothing was learned. Measured on chapter 8's CPU arms (2026-12-05, seed 0): runs that
# learn reach 0.1 to 0.4 in 24 steps; beta 5 held it at 0.0026, a learning rate of 7e-5 lower still.
KL_STILL = 0.005
# ... and held-out accuracy within this of where it began: any weight that moves flips a prompt or two
# (chapter 8's beta-5 arm, 16 steps: 73.4% -> 75.0%, one prompt of 64).
STILL_RISE = 0.05
BETA_HOLDS = 0.5  # a beta from here up is named as the pull that held it (25 times the book's 0.02)
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
        reward_funcs = get_task(values["task"], values.get("task_config")).reward_funcs
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
    findings += _no_diversity(rows, values, advise, most)
    # The answer rewards' own spread: paid on under RARE_CORRECT of completions, nearly every group has
    # no right answer in it, so the answer teaches nothing even where the format's reward still differs
    # within a group (chapter 8's digit-sum arm: TRL's frac_reward_zero_std near 0, correctness 0.003).
    paid = {r: statistics.fmean(s) for r in answers if (s := series(rows, r.metric))}
    out_of_reach = bool(paid) and all(m < RARE_CORRECT * r.max_reward for r, m in paid.items())
    share = statistics.fmean(flat) if flat else 0.0
    if (share >= NO_SIGNAL_SHARE or out_of_reach) and not findings:
        idle = sum(1 for f in flat if f >= 0.999)
        level = statistics.fmean(reward) if reward else 0.0
        task = _task(values)
        if level >= SOLVED * most:
            why = "the task is too easy for the policy: it already solves it"
            fix = _question(task, "harder", accepts, advise) or (
                "pick a harder task with --task" if "task" in accepts else "pick a harder task"
            )
        elif out_of_reach and level > LOW_REWARD:
            why = (
                f"completions earn the format and almost never the answer (correctness "
                f"{', '.join(f'{m:.3f}' for m in paid.values())} on average in "
                f"{', '.join(r.metric for r in paid)}): nearly every group held no right answer, so none "
                f"beat its group: the task is out of the policy's reach"
            )
            fix = _question(task, "easier", accepts, advise) or (
                advise(raise_("num_generations"), raise_("temperature")) + ", or an easier task"
            )
        elif level <= LOW_REWARD:
            why = "most groups scored nothing"
            fix = advise(raise_("num_generations"), raise_("temperature"))
        else:
            why = "too many groups are all right or all wrong together"
            fix = advise(raise_("num_generations"), raise_("temperature"))
        findings.append(
            Finding(
                "no_learning_signal",
                f"in {share:.0%} of groups every completion scored the same ({idle} of "
                f"{len(flat)} steps had no signal at all; mean reward {level:.3f}): {why}: {fix}",
            )
        )

    clipped = series(rows, "completions/clipped_ratio")
    formats = [(r, statistics.fmean(s)) for r in shaping if (s := series(rows, r.metric))]
    cut_before = [(r, m) for r, m in formats if m < CUT_FORMAT_SHARE * r.max_reward]
    if clipped and statistics.fmean(clipped) >= CLIPPED_SHARE and cut_before:
        findings.append(
            Finding(
                "cut_before_the_tag",
                f"{statistics.fmean(clipped):.0%} of completions were cut at max_completion_length "
                f"{values.get('max_completion_length')} while {', '.join(f'{r.metric} paid {m:.3f} of its {r.max_reward:g}' for r, m in cut_before)}: "
                f"they end before the answer's tag, so no answer is ever scored: {advise(raise_('max_completion_length', _room(values)))}",
            )
        )
    elif clipped and statistics.fmean(clipped) >= CLIPPED_SHARE:
        findings.append(
            Finding(
                "completions_cut",
                f"{statistics.fmean(clipped):.0%} of completions were cut at max_completion_length "
                f"{values.get('max_completion_length')} ({quarters(clipped)[3]:.0%} in the last quarter): the "
                f"answer never came: {advise(raise_('max_completion_length', _room(values)))}, or penalise length",
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

    if "cut_before_the_tag" in {f.name for f in findings}:
        # Completions cut to a few tokens have no room to differ, and groups with no answer score the
        # same: the cut is the culprit, not the sampling or the group size. (Chapter 8's cut arm: the
        # first doctor named no_learning_signal beside the cut, and advised more generations.)
        findings = [f for f in findings if f.name not in ("no_diversity", "no_learning_signal")]
    findings += _proxy_hacking(rows, values, rewards, before, after)
    never = _reward_never_pays(rows, logged, values)
    if never and answers and all(max(series(rows, r.metric) or [1.0]) == 0.0 for r in answers):
        # Every answer reward the run was paid stayed at zero: it was paid for the format alone. The
        # format rising while held-out accuracy falls, and groups that score the same once the format
        # is learned, are the parse's doing. (Chapter 8's mistagged arm was also named reward_hacking,
        # whose step, a smaller learning rate, mends nothing.)
        findings = [f for f in findings if f.name not in ("reward_hacking", "no_learning_signal")]
    findings += never
    if off_policy := _rollouts_not_from_policy(rows, values, advise):
        # TRL scores the rewards and estimates the KL (k3) and the entropy on the rollouts, as if they
        # were the policy's own samples: from another policy they describe that one, not what the
        # adapter learned or how far it drifted. (Chapter 8's unsynced arm was also named kl_climbing
        # on seed 0, and reward_hacking on seed 3 from the base's format reward wandering up; the step
        # of each, a smaller learning rate, mends nothing.)
        findings = [f for f in findings if f.name not in LEARNED_READINGS]
    findings += off_policy

    if not {"no_learning_signal", "cut_before_the_tag", "no_diversity", "reward_never_pays"} & {
        f.name for f in findings
    }:
        if still := _held_still(rows, values, answers, before, after, advise):
            # A policy that never left its start learned nothing, the format included: its rewards'
            # trends are its groups' luck. (Chapter 8's still arm at 14 steps, seed 0: KL 0.0000, held
            # out 73.4% -> 73.4%, and reward_hacking from format 0.083 -> 0.088 beside correctness
            # 0.188 -> 0.109; its step, a smaller learning rate, is the opposite of the one that mends.)
            findings = [f for f in findings if f.name not in LEARNED_READINGS]
        findings += still

    # A flat reward that another finding explains (no signal, or one of the book's culprits) is not
    # cured by a higher learning rate or more steps: it is not named twice.
    explained = {
        "no_learning_signal",
        "cut_before_the_tag",
        "no_diversity",
        "reward_never_pays",
        "held_at_the_start",
        "rollouts_not_from_policy",
    }
    if reward and not explained & {f.name for f in findings}:
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


def _held_still(
    rows, values: Mapping[str, Any], answers: Sequence[RewardInfo], before, after, advise
) -> list[Finding]:
    """The policy never left its start: KL to the reference stayed under KL_STILL and held-out accuracy
    rose by STILL_RISE at most (without a held-out evaluation: no answer reward climbed). Either the KL pull held it (beta from BETA_HOLDS up:
    lower it to the book's) or its steps were too small to move it (raise the learning rate to the
    book's for the profile). Read where KL is: a run with beta 0 logs none (Unsloth logs 0)."""
    kl = series(rows, "kl")
    beta = values.get("beta")
    if not kl or not isinstance(beta, (int, float)) or beta == 0:
        return []
    last = quarters(kl)[3]
    if last >= KL_STILL:
        return []
    if before is not None and after is not None:
        # Held out, the adapter against the base: a policy this close to its start moves its training
        # reward by a group's luck (chapter 8's arm at 7e-5: correctness 0.177 -> 0.198, held out 0).
        if after.accuracy - before.accuracy > STILL_RISE:
            return []
    elif any((t := _trend(rows, r)) and t[1] > t[0] + FLAT_SHARE * r.max_reward for r in answers):
        return []
    book = _book(values)
    held = f", held-out accuracy {before.accuracy:.1%} -> {after.accuracy:.1%}" if before and after else ""
    if beta >= BETA_HOLDS:
        why = f"the KL pull, beta {beta:g}, held it there: {advise(lower('beta', book.get('beta')))}"
    else:
        why = (
            f"its steps were too small to move it: "
            f"{advise(raise_('learning_rate', _above(values.get('learning_rate'), book.get('learning_rate'))))}"
        )
    return [
        Finding(
            "held_at_the_start",
            f"KL to the start stayed at {last:.4f} in the last quarter of {len(kl)} steps (a run that learns "
            f"moves ten times further){held}: the policy never left its start: {why}",
        )
    ]


def _task(values: Mapping[str, Any]):
    """The run's task, or None when the run names none."""
    return get_task(values["task"], values.get("task_config")) if values.get("task") is not None else None


def _question(task, which: str, accepts: Collection[str], advise) -> str | None:
    """The step to the task's `which` ("easier" or "harder") question, or None where it has no
    such neighbour (a task with no ladder) or the command cannot set one."""
    config = None if task is None else getattr(task, which)
    if config is None or "task_config" not in accepts:
        return None
    return f"{advise(set_to('task_config', config))} ({'an' if which == 'easier' else 'a'} {which} question of the same task)"


def _book(values: Mapping[str, Any]) -> dict[str, Any]:
    """The book's recipe for the run's profile (grpolab/recipe.toml), {} when the run names none."""
    from grpolab.config.settings import recipe

    profile = values.get("profile")
    return recipe(profile) if profile in ("cpu", "gpu") else {}


def _above(now: Any, bound: Any) -> Any:
    """A bound to raise to, only when it is above where the run is."""
    return (
        bound if isinstance(now, (int, float)) and isinstance(bound, (int, float)) and bound > now else None
    )


def next_step(finding: Finding, settings: Any) -> dict[str, Any]:
    """The settings a finding's printed next step changes, read back from its text (the inverse of
    budgets.advice.render): the first change the advice names with a value, typed as `settings` holds
    it. Chapter 8 trains with exactly this, so a next step the doctor printed wrong is trained wrong."""
    from budgets.advice import parse

    for change in parse(finding.message):
        if change.value is None or not hasattr(settings, change.setting):
            continue
        now = getattr(settings, change.setting)
        kind = type(now) if now is not None else str
        value = change.value.lower() == "true" if kind is bool else kind(change.value)
        return {change.setting: value}
    raise ValueError(f"{finding.name}'s next step names no setting with a value to apply: {finding.message}")


def _warmer(values: Mapping[str, Any]) -> float | None:
    """The temperature a group with no spread is sampled at: DIVERSE_TEMPERATURE, when the run's was
    below it (above it, the doctor says to raise it, by how much is the reader's call)."""
    now = values.get("temperature")
    return DIVERSE_TEMPERATURE if isinstance(now, (int, float)) and now < DIVERSE_TEMPERATURE else None


def _room(values: Mapping[str, Any]) -> int | None:
    """The max_completion_length a cut run needs at least: twice what it had, and never less than the
    task's longest reference completion in characters and its end token (characters bound any
    tokenizer's tokens: task.check's lengths line). None when the run's length is unknown."""
    now = values.get("max_completion_length")
    if not isinstance(now, int):
        return None
    reference = 0
    if values.get("task") is not None:
        t = get_task(values["task"], values.get("task_config"))
        rows = t.build_eval_dataset(32, 0)
        reference = max(len(f"<ans>{t.reference_answer(row)}</ans>") for row in rows) + 1
    return max(2 * now, reference)


def _no_diversity(
    rows: Sequence[dict[str, float]], values: Mapping[str, Any], advise, most: float
) -> list[Finding]:
    """Groups whose completions are (nearly) all the same from the start: sampling with no spread, so
    no completion beats its group and nothing is learned. Not a policy that converged (that comes late,
    after learning): the first quarter is read. Nor a policy that repeats a completion paid nearly all
    there is (`most`) at the book's temperature: that one is not cold but done, the task too easy for
    it (no_learning_signal's; chapter 8's solved arm, at temperature 1.0, was first named here, with a
    warmer temperature as the step, which mends nothing). Below that temperature it is cold, whatever
    its first groups were paid: chapter 8's cold arm at 0.05 answered its first 8 prompts right on
    seed 1, and was named nothing it could mend until this read the temperature."""
    distinct, group = series(rows, "completions/distinct_share"), values.get("num_generations")
    reward = series(rows, "reward")
    cold = _warmer(values) is not None
    if not cold and reward and statistics.fmean(reward[: max(len(reward) // 4, MIN_STEPS)]) >= SOLVED * most:
        return []
    # A confident model samples the same answer often (the CPU stand-in writes 1 to 6 distinct ones of
    # 16, one group a step): that still teaches. A group that is one completion, repeated, cannot.
    # The first quarter, and at least the first MIN_STEPS steps: a short run's first quarter is one
    # or two groups, and one group of a confident model can be one completion by chance.
    early = distinct[: max(len(distinct) // 4, MIN_STEPS)]
    if not distinct or not isinstance(group, int) or statistics.fmean(early) * group > NO_DIVERSITY:
        return []
    return [
        Finding(
            "no_diversity",
            f"in the first {len(early)} steps a group of {group} held about {statistics.fmean(early) * group:.1f} distinct "
            f"completions: one completion, repeated, so none could beat its group: the sampling temperature "
            f"{values.get('temperature')} leaves the group no spread to learn from: "
            f"{advise(raise_('temperature', _warmer(values)))}",
        )
    ]


def _reward_never_pays(
    rows: Sequence[dict[str, float]], rewards: Sequence[RewardInfo], values: Mapping[str, Any]
) -> list[Finding]:
    """A reward that paid nothing on any step while the completions held something that looks like the
    answer tag: its parse rejects what the model writes (a reward silently returning zeros). When that
    reward is not the task's own and the task's own answer reward, logged beside it, paid on the same
    completions, the next step is to pay the task's (chapter 8's mistagged arm: open-r1's `<answer>`
    parse on a prompt that asks for `<ans>`)."""
    tagged = series(rows, "completions/tag_like_ratio")
    if not tagged or statistics.fmean(tagged) < TAG_LIKE:
        return []
    pays = {r for r in rewards if (s := series(rows, r.metric)) and max(s) > 0.0}
    silent = [r for r in rewards if series(rows, r.metric) and r not in pays]
    own = run_rewards(values) if values.get("task") else ()
    if pays & set(own):
        # A task's own rewards share its one parse_answer: one of them paying shows the parse reads
        # what the model writes, and the silent one's zeros are wrong answers (no_learning_signal's).
        silent = [r for r in silent if r not in own]
    if not silent:
        return []
    names = ", ".join(r.name for r in silent)
    paying = [r for r in own if r.role is RewardRole.ANSWER and r in pays]
    foreign = [r for r in silent if r.role is RewardRole.ANSWER and r not in own]
    if paying and foreign:
        step = (
            f"pay the task's own {paying[0].name} in place of {foreign[0].name} (it paid "
            f"{statistics.fmean(series(rows, paying[0].metric)):.3f} on the same completions: its parse reads the "
            f"tag the task's prompt asks for)"
        )
    else:
        step = (
            "score a few of the run's completions by hand (its Traces tab) against the task's parse_answer, "
            "and fix the parse or what the prompt asks for"
        )
    return [
        Finding(
            "reward_never_pays",
            f"{names} paid nothing in {len(rows)} steps while {statistics.fmean(tagged):.0%} of completions held "
            f"something that looks like the answer tag: the reward's parse rejects what the model writes: {step}",
        )
    ]


_SWAP = re.compile(r"pay the task's own (?P<instead>\w+) in place of (?P<silent>\w+)")


def reward_swap(finding: Finding) -> tuple[str, str] | None:
    """The reward a finding's next step says to pay in place of another, read back from its text:
    (the silent reward's name, the task's own reward's name); None when it names no such swap."""
    m = _SWAP.search(finding.message)
    return None if m is None else (m["silent"], m["instead"])


def _rollouts_not_from_policy(
    rows: Sequence[dict[str, float]], values: Mapping[str, Any], advise
) -> list[Finding]:
    """vLLM's log-probs of its own samples drift away from the trainer's as the adapter trains: the
    rollouts come from another policy than the one being trained, the base when the adapter never
    reaches vLLM (Unsloth PR 8701: losses look finite, nothing is learned). Read where it is logged:
    a GPU run with `vllm_importance_sampling_correction` on, and a CPU run with `rollout_adapter`
    false (chapter 8's reproduction, grpolab.model.rollouts), whose next step turns it back on."""
    gap = series(rows, LOGP_METRIC)
    if not gap:
        return []
    first, _, _, last = quarters(gap)
    if last < LOGP_GAP or last < LOGP_GROWTH * max(first, 1e-9):
        return []
    kl = series(rows, "kl")
    beside = f", beside a KL to the base of {quarters(kl)[3]:.3f}" if kl else ""
    drift = f"{first:.3f} -> {last:.3f} nats per token (first and last quarter, {LOGP_METRIC}){beside}"
    if values.get("rollout_adapter") is False:
        # The CPU's reproduction (grpolab.model.rollouts): the run itself said to sample from the base.
        sampler, why = (
            "the sampler",
            "the rollouts come from the base, with the adapter being trained disabled",
        )
        step = advise(set_to("rollout_adapter", True))
    else:
        sampler = "vLLM"
        why = "the rollouts do not come from the adapter being trained (the LoRA weights never reached vLLM)"
        step = (
            f"update unsloth and unsloth_zoo, or {advise(set_to('fast_inference', False))} to generate with "
            "the trainer's own model"
        )
    return [
        Finding(
            "rollouts_not_from_policy",
            f"{sampler}'s log-probs of the completions it sampled drifted from the trainer's, {drift}: {why}: {step}",
        )
    ]


def _proxy_hacking(
    rows: Sequence[dict[str, float]], values: Mapping[str, Any], trained: Sequence[RewardInfo], before, after
) -> list[Finding]:
    """reward_hacking by a proxy: a trained answer reward the task does not declare rose, while the
    task's exact answer reward on the same completions (logged at weight 0) fell behind it, or, when
    it was not logged, while held-out accuracy did not rise. Names the step the two parted."""
    if values.get("task") is None:
        return []
    own = get_task(values["task"], values.get("task_config")).rewards
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


def trends(
    history: Sequence[dict[str, float]],
    values: Mapping[str, Any],
    reward_funcs: Sequence[RewardFunc] | None = None,
    reward_weights: Sequence[float] | None = None,
) -> str:
    """Each reward the policy was paid, first quarter -> last quarter of its steps: the curves a reader
    checks first ("correctness_reward 0.067 -> 0.446, format_reward 0.027 -> 0.184")."""
    logged = run_rewards(values, reward_funcs)
    weights = [1.0] * len(logged) if reward_weights is None else list(reward_weights)
    rows = step_rows(history)
    moved = [
        f"{r.name} {t[0]:.3f} -> {t[1]:.3f}"
        for r, w in zip(logged, weights, strict=True)
        if w != 0 and (t := _trend(rows, r)) is not None
    ]
    return f"{', '.join(moved)} (first -> last quarter of {len(rows)} steps)" if moved else ""


def verdict(
    findings: list[Finding], before=None, after=None, steps: int | None = None, curves: str = ""
) -> str:
    """One paragraph for the summary and the run's description: the findings, or that there were none,
    with the paid rewards' curves (`trends`) and the held-out accuracy before and after."""
    if steps is not None and steps < MIN_STEPS:
        return f"Run doctor: {steps} logged step(s) are too few to read a trend from (it needs {MIN_STEPS})."
    held_out = f" Rewards: {curves}." if curves else ""
    if before is not None and after is not None:
        held_out += (
            f" Held-out accuracy {before.accuracy:.1%} -> {after.accuracy:.1%}, format "
            f"{before.format_rate:.1%} -> {after.format_rate:.1%} (base -> adapter)."
        )
    if not findings:
        return "Run doctor: nothing held learning back." + held_out
    return f"Run doctor: {len(findings)} finding(s).{held_out} " + " ".join(f"[{f}]" for f in findings)
