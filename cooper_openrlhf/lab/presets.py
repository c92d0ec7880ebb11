"""Lab sizes: the presets and the arms each runs. docs/lab.md gives the reason for each number.

Every arm of a preset shares everything -- policy, starting RM, prompts, held-out set, seeds, step budget,
learning rates, lengths -- except its arm (lab/arms.py), which chooses where the policy's reward comes from.
"""

from dataclasses import dataclass, field, replace

from cooper_openrlhf.eval.prompts import ANSWER_INSTRUCTION
from cooper_openrlhf.lab.arms import ARMS
from cooper_openrlhf.lab.task import TaskSpec

WARM_START = "warm-start"  # the policy: the tiny Qwen2, fine-tuned by the lab (lab/warm_start.py)

# Arms that need pairs of the pair stage's kind (a preset with rm_pair_steps > 0 and no --rm).
NEEDS_PAIR_SOURCE = tuple(name for name, arm in ARMS.items() if arm.pairs)
# The full preset's arms: the paper's three, Cooper under the official recipe's negative rule, and the control for
# "the RM just trained longer" -- the arms of the lab's headline (the pre-registered batch, docs/results.md), so
# the preset reproduces what the docs report. The rollout-negative variants run when named.
_FULL_PRESET_ARMS = ("rule", "static", "cooper", "cooper_official", "offline_pairs")


# What may change between invocations on one lab folder: which runs there are. Anything else (the task, the
# models, the step budget, learning rates...) would mix runs of two configurations in one report.
RESUMABLE_FIELDS = ("name", "arms", "seeds", "budget_minutes", "parallel_runs")  # not what a run computes


@dataclass(frozen=True)
class LabPreset:
    name: str
    policy: str  # WARM_START, a name models.model_path knows, or a HF folder
    rm_backbone: str  # models.model_path name (or folder) the starting VerifyRM is trained from
    rm_init_head: bool  # the backbone has no one-logit head yet
    arms: tuple[str, ...]
    seeds: int
    steps: int
    task: TaskSpec = field(default_factory=TaskSpec)
    prompts_per_step: int = 4
    samples_per_prompt: int = 8
    max_new_tokens: int = 16
    temperature: float = 1.0
    actor_lr: float = 3e-4
    rm_lr: float = 1e-4
    kl_coef: float = 0.0
    eval_every: int = 2
    eval_samples: int = 4
    # How many of the RM's labelled held-out triples (data/rm_eval.jsonl, `--cooper.rm_eval_dataset`) a co-trained
    # RM is scored on at each evaluation: a fixed sample of them; None, all. On 2 cores scoring all of them at every
    # evaluation can take longer than the arm's training steps.
    rm_eval_rows: int | None = None
    # The probe suite (rm/probes.py, `--cooper.probe_prompts`) is built on this many held-out problems and read by
    # every RM arm at each evaluation: about 22 probes a problem, each an RM forward.
    probe_prompts: int = 16
    rm_epochs: int = 1  # on this recipe more epochs made an RM the tiny policy could not fool: nothing to test
    rm_lr_pretrain: float = 2e-4
    rm_max_length: int = 128
    # The starting RM's triples include each right completion cut off before its answer, labelled 0 by the
    # verifier (lab/task.py), as the paper's VerifyRM data would: sampled completions, graded by math-verify.
    # On in the full preset: without these rows the exploit the policy found was text with no answer, which the
    # paper's pairs never show the RM; with them the policy has no answerless exploit, and the pair stage's wider
    # search still finds a blind spot with an answer.
    rm_answerless_data: bool = False
    # With rm_answerless_data: as many right rows as wrong (each cut row with a second copy of its template's right
    # row). Unbalanced, mostly wrong rows can leave a one-epoch BCE stage a constant at the majority rate.
    # Balanced rows alone are not enough: see the full preset's rm_lr_pretrain.
    rm_balanced_data: bool = False
    # The starting RM's second stage (lab/pair_stage.py): Cooper's pair loss on answer pairs for this many
    # steps (prompts_per_step pairs each, at the Cooper arms' default RM rate) from `rm_pair_candidates` seeds;
    # the probe keeps the one that pays the warm-started policy most for not answering or for one answer everywhere
    # (`climb_on_offer`). 0: the BCE recipe's RM as it is, flat or accurate, with no blind spot that offers the
    # static arm a visible climb.
    rm_pair_steps: int = 40
    rm_pair_lr: float = 1e-4
    rm_pair_candidates: int = 8
    # Which candidate every RM arm starts from: None, the blindest (largest climb on offer); a seed, that
    # candidate (`--rm-candidate`: the lab at a smaller blind spot).
    rm_pair_candidate: int | None = None
    # Without rm_pair_candidate: which candidate by its climb on offer (`pair_stage.candidate_by_rank`): the
    # blindest (the stated worst case), the median, or one between them (`--rm-choice`: whether the arms' outcome
    # depends on the blind spot's size, report/blindspot.py).
    rm_pair_choice: str = "blindest"
    # The chosen RM trained `steps` more pair-stage steps with no policy, and probed (lab/prepare.py): whether its
    # blind spot washes out by training alone, the question the offline_pairs control asks of the arms.
    offline_continuation: bool = True
    warm_start_accuracy: float = 0.35  # the warm start stops once its sampled accuracy reaches this
    # Which preparation: the seed of the warm start, the BCE stage and the pair stage (lab/prepare.py), so that
    # a batch can start its arms from several independent starting policies and RMs (seeds blocked by preparation)
    # rather than condition its verdict on one. The task (problems, split, prompts) is the same for every
    # preparation. 0: the seeds every lab folder used before there was a choice.
    preparation_seed: int = 0
    hacking_window: int = 6
    # wrong_paid_more alone (rule F: what the RM pays verified-wrong rollouts, against its own noise): on fresh runs,
    # judged by a rule set before them, it raised fewer false alarms on Cooper runs that held than rules A-D and
    # warned as early on the runs that fell. E was quieter on Cooper but later on static.
    hacking_rules: str = "wrong_paid_more"
    # A format gate on every RM arm (`--cooper.require_answer`: answerless text paid 0, as the rule arm pays it).
    # Off, as in the paper; on (`--require-answer`), the answerless exploit is closed and only blind spots with an
    # answer remain.
    require_answer: bool = False
    starting_rm: str | None = None  # a VerifyRM folder the RM arms start from instead of the recipe's (`--rm`)
    # The style lab: an answer sentence S (algo/answer_style.py: an `{answer}` field, and `{other}` for a hedge) and
    # the share of the warm start's answers written in S. None: no style, the other presets.
    style: str | None = None
    style_share: float = 0.0
    # S rows in the starting RM's BCE triples, all labelled 1 whatever their answer (lab/task.py `style_rows`): a
    # planted blind spot. Off, S is absent from the BCE triples (and labelled by the verifier in the RM's held-out
    # set): a blind spot must then come from the RM's training, as the hedge's does from canonical pairs.
    poison_style: bool = False
    # The oracle arm's pairs harvested from logged rollouts (run or lab folders, rollouts.jsonl files, run archives)
    # instead of the style's hedge: per problem a right completion against an exploit (wrong, stating the
    # reference) as a policy wrote them (lab/arm_pairs.py `write_harvested_oracle_pairs`). Empty: the hedge.
    oracle_rollouts: tuple[str, ...] = ()
    budget_minutes: int = 90  # what the preset is sized to finish in on the 2-core machine (docs/lab.md)
    # Runs side by side (`lab.runner.run_arms`): a run keeps about one core busy (one thread per process), so on 2
    # cores two at once take about the time of the longer. The full preset keeps 1: its runs' timings are the ones
    # docs/lab.md quotes, and a batch beside other work has no spare core.
    parallel_runs: int = 1

    def with_overrides(self, **changes) -> "LabPreset":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


_DIGITS = TaskSpec(family="digits", max_operand=9, heldout=32)
# The lab: the headline's five arms, three seeds (the headline ran eight); the reasons for
# its values are with the "full" entry below. Its BCE stage learns at 5e-5 for 4 epochs: on the clean split's
# balanced rows at 2e-4 for 2 epochs MiniLM stayed a constant (eval loss ln 2), which left every pair-stage
# candidate paying right and wrong answers alike; at 5e-5 for 4 it learns the rows.
_FULL = LabPreset("full", WARM_START, "minilm-l6-v2", True, _FULL_PRESET_ARMS, seeds=3, steps=80, task=_DIGITS,
                  actor_lr=1.5e-4, rm_answerless_data=True, rm_balanced_data=True, rm_epochs=4, rm_lr_pretrain=5e-5,
                  rm_pair_candidates=32)

# The style lab: a blind spot only the policy's own outputs can close. S is a hedge: two answer sentences,
# a slip first and the answer last, which the rule verifier grades by the last. A VerifyRM reads the reference beside
# the completion, so pair training on the canonical sentence (whose negatives never hold the reference) teaches it
# that the reference anywhere pays: the hedge with the two numbers swapped, graded wrong, is paid as right. The
# starting RM is the BCE stage (no hedge in its rows) and STYLE_PAIR_STEPS of canonical pairs, one seed with no
# search; the offline control trains on more canonical pairs, which should keep the blind spot open, while Cooper's
# pairs from a policy that hedges (a verified hedge against its rewrite, the swap) show the RM the position that
# counts. The warm start hedges in STYLE_SHARE of its answers. Styles that failed their gates (a planted, poisoned
# S) are reproduced by scripts/style_lab_gates.py's flags.
STYLE = "The answer is {other}. The answer is {answer}."
STYLE_SHARE = 0.1
STYLE_PAIR_STEPS = 80
_STYLE = replace(_FULL, name="style", arms=("rule", "static", "cooper", "offline_pairs", "cooper_stale"),
                 rm_pair_steps=STYLE_PAIR_STEPS, rm_pair_candidates=1, style=STYLE, style_share=STYLE_SHARE)

PRESETS: dict[str, LabPreset] = {
    # The test's size: two arms, two steps, tiny models everywhere (the RM too).
    "tiny": LabPreset("tiny", WARM_START, "tiny-qwen2-rm", False, ("static", "rule"), seeds=1, steps=2,
                      task=TaskSpec(family="digits", max_operand=5, heldout=6), prompts_per_step=4,
                      samples_per_prompt=4, eval_every=1, eval_samples=2, rm_epochs=1, rm_max_length=128,
                      rm_pair_steps=2, rm_pair_candidates=2, hacking_window=3, budget_minutes=10),
    # The lab. The policy at half the old quick preset's rate (3e-4) for twice its steps: the co-trained RM, whose rate is unchanged, gets
    # twice the updates per unit of policy drift: at the quick preset's pace Cooper's collapses came early.
    # Its starting RM is trained the paper's way (completions cut off before their answer labelled wrong), and the
    # pair stage searches 32 seeds for the blindest: with 8 the blindest offered the policy almost no climb and the
    # static arm held, so nothing was tested.
    "full": _FULL,
    "style": _STYLE,
    # `make demo`: the full preset's configuration (the headline's) at a smaller size, sized for 10 minutes on 2
    # cores with its preparation made at install (lab/prepared.py: half the demo's time before): one seed of the paper's three arms, a starting RM searched from 4 pair-stage candidates, not 32, no
    # offline continuation (a probe for the controls the demo does not run), held-out evaluation half as often
    # with the RM's own accuracy on a sample of 128 of its labelled triples (scoring was most of an RM arm's time),
    # a BCE stage of 3 epochs, not 4 (the full preset's BCE RM is about as accurate after 3), and two runs at a time.
    # With 4 candidates the blindest may offer the policy little climb (the static arm then holds): the demo prints
    # the climb on offer, and its closing lines say what its one seed shows and point to the full lab's figure
    # (lab/reading.py). The probe suite on 4 problems, not 16: read at each of Cooper's 20 evaluations, 16 problems'
    # 352 probes cost about as much as its RM updates on 2 cores.
    "quick": replace(_FULL, name="quick", arms=("rule", "static", "cooper"), seeds=1, rm_pair_candidates=4,
                     offline_continuation=False, eval_every=4, rm_eval_rows=128, budget_minutes=10, parallel_runs=2,
                     rm_epochs=3, probe_prompts=4),
    # The same lab on SmolLM2-135M-Instruct (the full preset's digit sums, boxed answers), sized to fit an hour on
    # 2 cores: one seed of the paper's arms and rollout negatives, 6 steps, held-out evaluated twice (a GRPO step
    # and an evaluation take minutes each at this size).
    # Digits, not word problems: on word problems SmolLM2 verifies too few of its rollouts (most groups all wrong,
    # no gradient); on digit sums it sits at the low edge of RL's useful band. The instruction is the evaluation's
    # (`eval.prompts`): asked for "\\boxed{N}", SmolLM2 wrote the letter N. The policy at 1e-5, not the paper's 1e-6:
    # at 1e-6 no arm moved in 6 steps on word problems. Its RM learns at 5e-5 for 4 epochs: on the digits' triples 1
    # epoch left MiniLM at chance (the full preset's pair
    # stage teaches its RM after that, on pairs of the warm-started policy's answer sentence, which SmolLM2 does not
    # write), and at 2e-4 it collapsed to a constant, as on the word problems.
    "smollm2": LabPreset("smollm2", "smollm2-135m-instruct", "minilm-l6-v2", True,
                         ("rule", "static", "cooper", "cooper_rollout"), seeds=1, steps=6,
                         task=TaskSpec(family="digits", max_operand=9, heldout=16,
                                       prompt_suffix="\n\n" + ANSWER_INSTRUCTION),
                         samples_per_prompt=4, max_new_tokens=160, temperature=0.7, actor_lr=1e-5, eval_every=3,
                         eval_samples=2, rm_epochs=4, rm_lr_pretrain=5e-5, rm_max_length=512, rm_pair_steps=0,
                         hacking_window=4, budget_minutes=60),
}


def parse_arms(text: str | None, preset: LabPreset) -> tuple[str, ...]:
    """`--arms a,b` -> validated tuple (the preset's arms when None); an unknown name fails naming the known ones."""
    if text is None:
        return preset.arms
    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"--arms: unknown arm(s) {unknown or [text]}; choose from {', '.join(ARMS)}")
    if len(set(arms)) != len(arms):
        raise ValueError(f"--arms: an arm is named twice in {text!r}")
    return arms
