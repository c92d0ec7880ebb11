"""Whether the service's GRPO groups are the trainer's, and which prompts are held out; pure functions.

The service cannot see the trainer's n_samples_per_prompt: OpenRLHF sends each sample alone. It can see two
invariants that hold whenever `--group-size` is the trainer's n and `--groups-per-update` its prompts per step,
because a step's P prompts each send exactly n samples, and the trainer sends no sample of step t+1 before every
sample of step t is answered (in async mode too: generation of t+1 starts after generation of t ends):
  1. at most P prompts have a group open at once (the step's prompts);
  2. (synchronous trainer) when the P-th complete group of a round completes, no other group is open: that was
     the step's last sample.
A trainer with n < group size leaves every group incomplete, so step t+1's groups open beside step t's and (1)
breaks; a trainer with n > group size fills a prompt's first group and goes on filling a second one, so the round
completes mid-step and (2) breaks (and the second half of each trainer group would be scored by the next RM version).
Held-out prompts that reach the same URL (OpenRLHF's `--eval.dataset` rollouts) break (1) and (2) the same way
when they are not declared. A sample of a held-out prompt (`--heldout-prompts FILE`) is scored by the latest RM and
never joins a group, so it is never learned from.
"""

from collections import Counter
from collections.abc import Iterable

from cooper_openrlhf.data.rows import RowFormatError, iter_rows


class GroupMismatch(RuntimeError):
    """The trainer's groups are not the service's; the message names the numbers and the fix."""


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
            f"(the trainer's prompts per step): groups stay incomplete (samples so far: {held}; --group-size "
            f"{group_size}). Most likely the trainer sends {typical} samples per prompt (--rollout.n_samples_per_prompt "
            f"{typical}) while --group-size is {group_size}: restart the service with --group-size {typical}. Or "
            f"held-out prompts reach the service (pass the trainer's --eval.dataset file as --heldout-prompts), or "
            f"--groups-per-update is below the trainer's prompts per step (--rollout.batch_size)")


def open_when_a_round_completes(others: list[tuple[str, int]], prompt_samples: dict[str, int], group_size: int,
                                groups_per_update: int) -> str | None:
    """Invariant (2): the sentence of its breach, or None.

    others: (prompt, samples so far) of each group still open when a round's last group completed; prompt_samples:
    samples of each prompt scored by the round's RM version, complete groups included."""
    if not others:
        return None
    most = max(prompt_samples.get(prompt, count) for prompt, count in others)
    opening = (f"a round of {groups_per_update} complete GRPO groups formed while {len(others)} more were open: the "
               f"trainer's step was not over. ")
    heldout = ("held-out prompts reach the service (pass the trainer's --eval.dataset file as --heldout-prompts)")
    if most > group_size:
        return (opening + f"A prompt has {most} samples at this RM version, more than --group-size {group_size}: the "
                f"trainer sends more samples per prompt (--rollout.n_samples_per_prompt) than --group-size; restart the "
                f"service with --group-size set to it. Or {heldout}, or --groups-per-update is below the trainer's "
                f"prompts per step (--rollout.batch_size)")
    return (opening + f"Most likely --groups-per-update {groups_per_update} is below the trainer's prompts per step "
            f"(--rollout.batch_size), or {heldout}; or the trainer sends more than --group-size {group_size} samples "
            f"per prompt (an open group holds {most} so far)")


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
