"""Whether the service's GRPO groups are the trainer's, and which prompts are held out; pure functions.

The service cannot see the trainer's n_samples_per_prompt: OpenRLHF sends each sample alone. It can see two
invariants that hold whenever `--group-size` is the trainer's n and `--groups-per-update` its prompts per step,
because a step's P prompts each send exactly n samples, and the trainer sends no sample of step t+1 before every
sample of step t is answered (in async mode too: generation of t+1 starts after generation of t ends):
  1. at most P prompts have a group open at once (the step's prompts);
  2. (synchronous trainer) when the P-th complete group of a step completes, no other group is open: that was
     the step's last sample.
A trainer with n < group size leaves every group incomplete, so step t+1's groups open beside step t's and (1)
breaks; a trainer with n > group size fills a prompt's first group and goes on filling a second one, so the step
completes mid-step and (2) breaks. Held-out prompts that reach the same URL (OpenRLHF's `--eval.dataset`
rollouts) break them the same way when they are not declared. But so do harmless events of a real run: the
partial last step of an episode, a trainer restarted mid-step, a retried sample, one request sent by hand. So a
breach is never a refusal: it is a warning (`GroupWarnings`: the log, `/health`, `/metrics`) naming the likely
causes and the fix, and what it costs is learning, counted where groups are dropped. Only when no group completes
at all for two steps' worth of samples is learning shown as failing (`no_group_completes`).

A sample of a held-out prompt (`--heldout-prompts FILE`) is scored by the latest RM and never joins a group, so it
is never learned from.
"""

import logging
from collections import Counter
from collections.abc import Iterable

from cooper_openrlhf.data.rows import RowFormatError, iter_rows
from cooper_openrlhf.serve.published_names import OPEN_AT_STEP_END

logger = logging.getLogger(__name__)

HARMLESS = ("an episode's partial last step, a trainer restarted mid-step, a retried sample or a request sent by "
            "hand cause this once and cost at most a few groups' learning")


def too_many_open(open_groups: list[tuple[str, int]], group_size: int, groups_per_update: int) -> str | None:
    """Invariant (1): the sentence of its breach, or None. open_groups: (prompt, samples so far) of each open group.
    Prompts are counted, not groups: a prompt of a trainer with n > group size has two groups open for a moment
    (invariant (2) catches that one), and a dataset may hold a prompt twice."""
    prompts = {prompt for prompt, _ in open_groups}
    if not groups_per_update or len(prompts) <= groups_per_update:
        return None
    counts = Counter(count for _, count in open_groups).most_common()
    typical, _ = counts[0]
    held = ", ".join(f"{n} with {c}" for c, n in counts)
    return (f"{len(prompts)} prompts have GRPO groups open at once, more than --groups-per-update {groups_per_update} "
            f"(the trainer's prompts per step); samples so far: {held} (--group-size {group_size}). If it lasts, "
            f"most likely the trainer sends {typical} samples per prompt (--rollout.n_samples_per_prompt {typical}) "
            f"while --group-size is {group_size}: restart the service with --group-size {typical} when convenient "
            f"(scoring goes on meanwhile; learning waits for groups that complete). Or held-out prompts reach the "
            f"service (pass the trainer's --eval.dataset file as --heldout-prompts), or --groups-per-update is below "
            f"the trainer's prompts per step (--rollout.batch_size). Once: {HARMLESS}")


def open_when_a_step_completes(others: list[tuple[str, int]], prompt_samples: dict[str, int], group_size: int,
                                groups_per_update: int) -> str | None:
    """Invariant (2): the sentence of its breach, or None.

    others: (prompt, samples so far) of each group still open when a step's last group completed; prompt_samples:
    samples of each prompt scored by the step's RM version, complete groups included."""
    if not others:
        return None
    most = max(prompt_samples.get(prompt, count) for prompt, count in others)
    opening = (f"a step of {groups_per_update} complete GRPO groups formed while {len(others)} more were open: the "
               f"trainer's step was not over. ")
    heldout = "held-out prompts reach the service (pass the trainer's --eval.dataset file as --heldout-prompts)"
    if most > group_size:
        return (opening + f"A prompt has {most} samples at this RM version, more than --group-size {group_size}: if "
                f"it lasts, the trainer sends more samples per prompt (--rollout.n_samples_per_prompt) than "
                f"--group-size (such prompts' groups are not learned from); restart the service with --group-size set "
                f"to it when convenient. Or {heldout}, or --groups-per-update is below the trainer's prompts per step "
                f"(--rollout.batch_size). Once: {HARMLESS}")
    return (opening + f"If it lasts, --groups-per-update {groups_per_update} is below the trainer's prompts per step "
            f"(--rollout.batch_size), or {heldout}, or the trainer sends more than --group-size {group_size} samples "
            f"per prompt (an open group holds {most} so far). Once: {HARMLESS}")


def no_group_completes(samples: int, group_size: int, groups_per_update: int, open_groups: int) -> str:
    """Why learning is failing when `samples` samples completed no group (two steps' worth or more)."""
    return (f"no GRPO group of --group-size {group_size} completed in the last {samples} samples ({open_groups} "
            f"groups open): the trainer most likely sends fewer samples per prompt (--rollout.n_samples_per_prompt) "
            f"than --group-size; every sample is scored, nothing is learned until the service runs with the "
            f"trainer's n as --group-size (--groups-per-update {groups_per_update})")


def shared_keys(groups: Iterable, others: Iterable) -> set:
    """(key, version) of the `groups` whose key ((prompt, label)) another group in `others` or `groups` holds at the
    same RM version: one trainer group split over two of the service's (n > group size, or a prompt twice in a
    step)."""
    groups = list(groups)
    seen = Counter((group.key, group.version) for group in [*groups, *others])
    return {(group.key, group.version) for group in groups if seen[(group.key, group.version)] > 1}


WARNING_KINDS = ("too many open", OPEN_AT_STEP_END, "split trainer group")


class GroupWarnings:
    """Warnings about the trainer's groups: logged at most once a minute per kind, counted, and shown in `/health`
    for `window_s` after the last one (then "ok" again: a one-off event leaves no mark but the counter)."""

    def __init__(self, clock, window_s: float = 600.0, log_every_s: float = 60.0):
        self.clock, self.window_s, self.log_every_s = clock, window_s, log_every_s
        self.counts: Counter = Counter()
        self._last: dict[str, float] = {}  # kind -> when last noted
        self._logged: dict[str, float] = {}
        self._sentence: str | None = None

    def note(self, kind: str, sentence: str | None) -> None:
        if sentence is None:
            return
        now = self.clock()
        self.counts[kind] += 1
        self._last[kind], self._sentence = now, sentence
        if now - self._logged.get(kind, -float("inf")) >= self.log_every_s:
            self._logged[kind] = now
            logger.warning("GRPO groups (%s, seen %d times; scoring goes on): %s", kind, self.counts[kind], sentence)

    @property
    def status(self) -> str:
        """What /health says of the groups: "ok", or "warning: <the last sentence>" within `window_s` of it."""
        if self._sentence is None or self.clock() - max(self._last.values()) > self.window_s:
            return "ok"
        return f"warning: {self._sentence}"


def last_user_message(value) -> str | None:
    """The question of a dataset row's input: the string itself, or the last user message of a conversation."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for message in reversed(value):
            if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
                return message["content"]
    return None


def heldout_questions(path: str, input_key: str = "input") -> frozenset[str]:
    """The questions of a held-out prompt file (OpenRLHF's `--eval.dataset` file: JSON Lines, JSON or parquet, the
    question under `input_key`); a ValueError naming the file, row and field otherwise."""
    questions = set()
    try:
        for row in iter_rows(path):
            question = last_user_message(row.data.get(input_key))
            if question is None:
                raise ValueError(f"{row.place}: field {input_key!r} is missing or holds no user message "
                                 f"(--heldout-input-key)")
            questions.add(question)
    except (OSError, RowFormatError) as exc:
        raise ValueError(f"--heldout-prompts {path}: {exc}") from None
    if not questions:
        raise ValueError(f"--heldout-prompts {path}: no rows")
    return frozenset(questions)


def samples_by_prompt(groups: Iterable, version: int) -> dict[str, int]:
    """Samples (reserved places) per prompt over `groups` pinned to `version`."""
    counts: dict[str, int] = {}
    for group in groups:
        if group.version == version:
            counts[group.prompt] = counts.get(group.prompt, 0) + group.reserved
    return counts
