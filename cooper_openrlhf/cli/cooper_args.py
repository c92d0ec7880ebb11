"""Cooper's command-line flags, added to OpenRLHF's own `train_ppo_ray` parser, and their cross-checks.

`add_cooper_args(parser)` adds `--remote_rm_trainable` and the `--cooper.*` group in OpenRLHF's dotted
style (after `hierarchize`, `args.cooper.rm_lr`, ...). Every default leaves a plain OpenRLHF run
unchanged: the flags are read only by `cli/train_cooper.py`, which stock `train_ppo_ray` reaches only
with `--remote_rm_trainable` (see `patches/`).

The three arms of the paper (arXiv 2508.05613, Table 1) come from one command:
  Cooper      --remote_rm_trainable                 RM rewards, RM trained each step on fresh pairs
  static RM   (flag off)                            RM rewards, RM frozen
  rule        --cooper.reward_source rule           rule-verifier rewards, no RM needed

`validate_cooper_args(args)` runs at start-up on the hierarchized namespace and raises `CooperArgsError`
naming the flags that clash, before any Ray actor or model is started.
"""

import argparse
import os

from cooper_openrlhf.algo.hacking import ALARM_RESPONSES, HackingMonitorConfig
from cooper_openrlhf.algo.rewards import REWARD_FORMS
from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES, NEGATIVE_VALIDITIES, ROLLOUT_NEGATIVE_PICKS
from cooper_openrlhf.core.pay import PAYERS
from cooper_openrlhf.core.rm_health import GuardConfig
from cooper_openrlhf.rm.anchors import ANCHOR_WEIGHT
from cooper_openrlhf.verify.extract import FALLBACKS

ASSISTANTS = ("policy", "model")
RM_ZERO_STAGES = (1, 2)
RM_UPDATE_GRANULARITIES = ("step", "minibatch")
# OpenRLHF 0.11.2's estimators with a per-prompt group baseline (experience_maker.py:268-276; they need
# --rollout.n_samples_per_prompt > 1, which its validation checks). gae needs a critic; reinforce has no baseline
# (with RM rewards in (0, 1) every rollout is pushed up); flash_reinforce is its batch-mean, one-rollout variant.
GROUP_ESTIMATORS = ("group_norm", "rloo", "reinforce_baseline", "dr_grpo")
# transformers.SchedulerType values that need no extra arguments from us.
RM_LR_SCHEDULERS = (
    "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr", "cosine_warmup_with_min_lr",
    "polynomial", "inverse_sqrt",
)


COOPER_GROUP = "Cooper"  # the argument group of every flag added here (`cooper train --help` prints it first)


class CooperArgsError(ValueError):
    """Cooper flags that cannot work together (raised at start-up); `problems` lists them, one line each."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems) if problems is not None else [message]


def add_cooper_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add `--remote_rm_trainable` and `--cooper.*` to OpenRLHF's `train_ppo_ray` parser, in one argument group
    (COOPER_GROUP); returns the parser."""
    group = parser.add_argument_group(COOPER_GROUP, "reward-model co-training (read only by `cooper train`)")
    add = group.add_argument
    add("--remote_rm_trainable", action="store_true", default=False,
        help="Cooper (arXiv 2508.05613): train the reward model during RL on one (verified-correct rollout, wrong "
        "negative: an assistant's rewrite by default, see --cooper.negative_source) pair per prompt each step; rewards "
        "of step t+1 come from the updated RM. Off in `cooper train` = the static-RM arm.")
    # Reward
    add("--cooper.reward_source", type=str, default="rm", choices=PAYERS,
        help="Where GRPO's rewards come from: 'rm' = the reward model at --reward.model_name_or_path, scored from "
        "(question, reference, completion) text through the VerifyRM template; 'rule' = the rule verifier (1 if "
        "math-verify says the rollout's answer equals the reference, else 0), the paper's rule-reward baseline.")
    add("--cooper.reward_form", type=str, default="continuous", choices=sorted(REWARD_FORMS),
        help="RM logit -> reward: 'continuous' = sigmoid(logit); 'discrete' = 1 if sigmoid(logit) >= "
        "--cooper.reward_threshold else 0 (Cooper sec. 3.2).")
    add("--cooper.reward_threshold", type=float, default=0.5,
        help="Probability threshold of the 'discrete' reward form, in (0, 1).")
    add("--cooper.require_answer", action="store_true", default=False,
        help="A format gate (not the paper's): the RM's reward of a rollout with no final answer (the rule verifier's "
        "no_answer) is 0, as the rule reward pays it. Closes the answerless exploit a frozen RM may leave open, which "
        "the paper's pairs cannot close (their negatives always carry an answer); cooper/rm_reward_*, "
        "cooper/reward_hacking_gap and eval/rm_reward are then the gated reward (the probe, pair-accuracy and "
        "rm_eval metrics read the RM itself).")
    # RM optimisation (DeepSpeed, like the actor's --actor.adam.* but the RM's own)
    add("--cooper.rm_lr", type=float, default=1e-5,
        help="RM learning rate (AdamW, betas (0.9, 0.95)); the official Cooper recipe uses 1e-5.")
    add("--cooper.rm_weight_decay", type=float, default=0.0, help="RM AdamW weight decay (not on biases/norms).")
    add("--cooper.rm_lr_scheduler", type=str, default="constant_with_warmup", choices=RM_LR_SCHEDULERS,
        help="RM learning-rate schedule (transformers get_scheduler name) over all RM optimizer steps of the run.")
    add("--cooper.rm_warmup_ratio", type=float, default=0.01,
        help="Fraction of the RM's optimizer steps spent warming up (the official recipe: 0.01).")
    add("--cooper.rm_max_norm", type=float, default=1.0,
        help="RM gradient clipping (DeepSpeed gradient_clipping); 0 disables it.")
    add("--cooper.rm_updates_per_step", type=int, default=1,
        help="RM optimizer steps per pair group: with --cooper.rm_update_granularity step, this many passes over all "
        "of the step's valid pairs, one optimizer step each; with minibatch, this many consecutive steps on each RM "
        "mini-batch.")
    add("--cooper.rm_update_granularity", type=str, default="step", choices=RM_UPDATE_GRANULARITIES,
        help="'step' = one RM optimizer step over all of the step's valid pairs (the masked mean of Eq. 5 over the "
        "whole batch); 'minibatch' = one optimizer step per --cooper.rm_mini_batch_size pairs, several per RL step, "
        "as the official recipe's RM worker does.")
    add("--cooper.rm_mini_batch_size", type=int, default=8,
        help="Valid pairs per RM optimizer step with --cooper.rm_update_granularity minibatch.")
    add("--cooper.rm_zero_stage", type=int, default=2, choices=RM_ZERO_STAGES,
        help="DeepSpeed ZeRO stage of the trainable RM (independent of --ds.zero_stage). Stage 2 skips a step with "
        "non-finite gradients, and stage 1 does too except with bf16 params and --ds.grad_accum_dtype fp32 (refused "
        "at start-up); the RM relies on that.")
    add("--cooper.rm_max_length", type=int, default=None,
        help="Max tokens of one RM input (template text); default: the max_length the VerifyRM export records, "
        "else 1024. Longer inputs are cut at the end, with a warning.")
    add("--cooper.rm_micro_batch_size", type=int, default=4,
        help="RM sequences per forward and backward on each RM rank when training (a pair is two sequences: rounded "
        "down to whole pairs, at least one pair).")
    add("--cooper.rm_score_batch_size", type=int, default=16,
        help="RM sequences per forward on each RM rank when scoring (the step's rollouts, and at --eval.steps the "
        "held-out rollouts, the probe suite and --cooper.rm_eval_dataset). No gradients are kept, so a forward can "
        "take more than a training micro-batch; as OpenRLHF's --rollout.micro_batch_size for its reward forwards.")
    add("--cooper.rm_save_path", type=str, default=None,
        help="Where the final RM is exported (VerifyRM format, loadable by rm.model.load_rm); default "
        "{--ckpt.output_dir}/rm. Only with --remote_rm_trainable.")
    # Negatives
    add("--cooper.assistant", type=str, default="policy", choices=ASSISTANTS,
        help="Who writes the negatives: 'policy' = the policy on its own vLLM engines (no extra GPU); 'model' = "
        "--cooper.assistant_model_path on one dedicated vLLM engine (one more GPU; only where rewrites are asked "
        "for: --remote_rm_trainable, assistant or mixed negatives, no --cooper.offline_pairs).")
    add("--cooper.assistant_model_path", type=str, default=None,
        help="HF path of the assistant model, with --cooper.assistant model.")
    add("--cooper.negative_source", type=str, default="assistant", choices=NEGATIVE_SOURCES,
        help="Where a prompt's negative comes from: 'assistant' = an assistant's rewrite of the positive into a "
        "wrong solution (the paper's); 'rollout' = one of the prompt's own rollouts whose answer the rule verifier "
        "proves different from the reference (no assistant, no extra generation; prompts without a wrong rollout "
        "have no pair); 'mixed' = a rollout negative where one exists, an assistant rewrite for the other prompts "
        "with a positive. The paper names the assistant as Cooper's main open cost; this ablates it.")
    add("--cooper.rollout_negative_pick", type=str, default="hardest", choices=ROLLOUT_NEGATIVE_PICKS,
        help="Which wrong rollout becomes the negative (rollout / mixed sources): 'hardest' = the one the current "
        "RM scores highest, i.e. exactly where the RM is being fooled, so each update corrects the RM's worst "
        "current mistake (the default for that reason); 'random' = a seeded uniform choice among them.")
    add("--cooper.answerless_negatives", action="store_true", default=False,
        help="Rollout / mixed sources: a rollout with no final answer (the verifier's no_answer; never a timeout or an "
        "error) may also be a prompt's negative against its verified-correct positive. Off by default, as in the paper, "
        "whose negatives always carry a wrong answer; but then a policy that drifts to answerless text is never shown "
        "to the RM as wrong and escapes co-training (in the lab, from a nearly flat starting RM, the RM arms, Cooper's "
        "too, collapsed to answerless text). Metric: cooper/pairs_answerless_negative.")
    add("--cooper.offline_pairs", type=str, default=None,
        help="A control, not Cooper: the RM update trains on this JSONL file's pairs ({step, question, reference, "
        "positive, negative}; the groups in step order, cycling when the file has fewer than the run has steps) "
        "instead of pairs from the policy's rollouts; the loss and the RM's update flags are unchanged and no "
        "rewrites are requested "
        "(algo/offline_pairs.py; the lab's offline_pairs arm). Needs --remote_rm_trainable.")
    add("--cooper.negative_validity", type=str, default="strict", choices=NEGATIVE_VALIDITIES,
        help="Which assistant rewrites count as negatives: 'strict' = the rewrite's final answer is proved different "
        "from the positive's (an answerless or undecided rewrite is rejected; this package's default, so a pair never "
        "holds a negative that might be right); 'official' = the official Cooper recipe's rule (github.com/ZJU-REAL/"
        "Cooper, recipe/cooper): any rewrite math-verify does not prove equal to the positive, an answerless one "
        "included. Metrics: cooper/negative_accepted_answerless, cooper/negative_accepted_undecided.")
    add("--cooper.negative_retries", type=int, default=3,
        help="Rewrite attempts per prompt; which rewrites count as negatives is --cooper.negative_validity's rule.")
    add("--cooper.negative_max_new_tokens", type=int, default=512, help="Max new tokens of one rewrite.")
    add("--cooper.negative_temperature", type=float, default=1.0, help="Sampling temperature of the rewrites.")
    add("--cooper.negative_answer_fallback", type=str, default="none", choices=FALLBACKS,
        help="How a rewrite's final answer is found: 'none' = only an explicit one (\\boxed{}, '####', 'the answer "
        "is'), as the rewrite prompt asks; 'last_number' also takes the last number of the text.")
    # Verification
    add("--cooper.answer_fallback", type=str, default="none", choices=FALLBACKS,
        help="How a rollout's final answer is found, for every verdict on a rollout (positives, the rule reward, "
        "no answer, proved wrong, held-out accuracy): 'none' = only an explicit one (\\boxed{}, '####', 'the answer "
        "is', 'answer:'); 'last_number' also math-verify's unanchored extraction (the last number or LaTeX span), which "
        "makes an unboxed or truncated rollout whose last number equals the reference a 'verified-correct' positive. "
        "The metric cooper/verify_fallback_only_correct counts the rollouts only the lax rule accepts.")
    add("--cooper.verifier_workers", type=int, default=2,
        help="Rule-verifier (math-verify) worker processes of the pair-construction actor.")
    add("--cooper.max_unparseable_reference_share", type=float, default=0.0,
        help="Share of prompt rows, in [0, 1], whose reference (--data.label_key) math-verify may fail to parse as a "
        "final answer (checked at start-up over the whole prompt set); above it the run stops naming the rows.")
    add("--cooper.verifier_deadline_s", type=float, default=10.0,
        help="Hard per-rollout verification deadline in seconds; a rollout past it counts as not verified correct.")
    # Reward-hacking monitor (algo/hacking.py: the rule, its thresholds and why their defaults are what they are)
    add("--cooper.on_hacking", type=str, default="warn", choices=ALARM_RESPONSES,
        help="What happens when the reward-hacking alarm (cooper/hacking_alarm, reasons in the log) turns on: 'warn' "
        "logs the reasons; 'stop' saves a checkpoint of the step (policy and RM) and ends the run with an error; "
        "'rule_reward' switches the policy's reward to the rule verifier from then on, a run resumed from a later "
        "checkpoint included (cooper/reward_from_rule).")
    for flag, kind, default, text in HackingMonitorConfig.flags():
        add(flag, type=kind, default=default, help=text)
    # The RM guard (core/rm_health.py; docs/cooper_step.md "The RM guard") and anchored updates
    for flag, kind, default, text, choices in GuardConfig.flags():
        add(flag, type=kind, default=default, choices=choices, help=text)
    add("--cooper.rm_anchors", type=str, default=None,
        help="Labelled rows kept out of the RM's training (JSON Lines: question, reference, completion, label 0/1; or "
        "VerifyBench rows) that the RM guard scores after every RM update. Default: eval_split.jsonl beside "
        "--reward.model_name_or_path (the VerifyRM recipe's held-out split; looked for in the RM's folder and the two "
        "above it). Bring your own RM: pass rows it never trained on.")
    add("--cooper.rm_anchor_rows", type=int, default=64,
        help="Labelled rows the RM guard reads, balanced right/wrong and chosen whole questions at a time; the rest "
        "(other questions) feed --cooper.rm_anchor_weight.")
    add("--cooper.rm_anchor_probe_problems", type=int, default=4,
        help="Problems of --eval.dataset (integer references) whose probe suite (rm/probes.py: canonical right and "
        "wrong answers, each attack form) joins the RM guard's anchors; 0: none.")
    add("--cooper.rm_anchor_weight", type=float, default=ANCHOR_WEIGHT,
        help="Anchored RM updates (not the paper's): BCE on --cooper.rm_anchor_batch labelled rows (the anchor file's "
        f"rows the guard does not read) beside the pairwise loss, at this weight, where the RM trains "
        "(--remote_rm_trainable). The default was chosen by the RM guard pilot (docs/cooper_step.md); 0 = the paper's "
        "update.")
    add("--cooper.rm_anchor_batch", type=int, default=16, help="Labelled rows per anchored RM update.")
    # Observability
    add("--cooper.rm_eval_dataset", type=str, default=None,
        help="A labelled verifier set (JSON Lines, VerifyBench format: question, answer, completion, gold_correct). "
        "Every --eval.steps steps the RM's accuracy on it (sigmoid(logit) >= 0.5 <=> gold_correct, whatever the "
        "reward form; a frozen RM is scored once) is logged as cooper/rm_eval_accuracy: the paper's check that the "
        "co-trained RM stays an accurate verifier.")
    add("--cooper.probe_prompts", type=int, default=16,
        help="RM arms with --eval.dataset: every --eval.steps steps the RM reads the probe suite (rm/probes.py: the "
        "exploit hedge, master keys, truncations, ... beside canonical right and wrong answers, each labelled by the "
        "rule verifier) built on the first this-many held-out problems with an integer reference, and logs "
        "cooper/probe_pay/<form> and cooper/probe_premium/<form> (the premium over canonical wrong answers). 0: off.")
    add("--cooper.sample_log_dir", type=str, default=None,
        help="If set, every step appends its rollouts (question, reference, completion, verified, reward) to "
        "rollouts.jsonl, its pairs to pairs.jsonl and every held-out evaluation its rollouts (reward: what the "
        "RM paid, null without an RM) to heldout.jsonl in this folder, for inspecting rewards and negatives.")
    return parser


def _fail(problems: list[str]) -> None:
    if problems:
        raise CooperArgsError("invalid Cooper configuration:\n  - " + "\n  - ".join(problems), problems)


def validate_cooper_args(args, cuda: bool | None = None) -> None:
    """Raise `CooperArgsError` listing every clash among the (hierarchized) flags; returns None when all is well.
    cuda: whether the run's models are on GPUs (`device_problems`; the launchers' preflight says so for the job's
    nodes, from GPUS_PER_NODE)."""
    cooper, reward = args.cooper, args.reward
    rm_path = reward.model_name_or_path
    needs_rm = cooper.reward_source == "rm" or args.remote_rm_trainable
    problems = []

    if not args.data.prompt_dataset:
        problems.append("--data.prompt_dataset is required")
    if not args.data.label_key:
        problems.append("--data.label_key is required: Cooper verifies every rollout against the prompt's reference "
                        "answer, which is read from that dataset field")
    if not args.vllm.num_engines:
        problems.append("--vllm.num_engines >= 1 is required: rollouts (and the policy's negatives) come from vLLM")
    if needs_rm and not rm_path:
        why = "--remote_rm_trainable trains it" if args.remote_rm_trainable else "--cooper.reward_source rm scores with it"
        problems.append(f"--reward.model_name_or_path is required ({why}); for the rule-reward arm pass "
                        "--cooper.reward_source rule")
    if rm_path and "," in rm_path:
        problems.append(f"--reward.model_name_or_path {rm_path!r}: Cooper uses exactly one reward model")
    if reward.remote_url or args.train.agent_func_path:
        what = "--reward.remote_url" if reward.remote_url else "--train.agent_func_path"
        problems.append(f"{what} cannot be combined with Cooper: its rewards would replace the local RM's "
                        "(and a remote RM cannot be trained with --remote_rm_trainable)")
    if args.algo.advantage.estimator not in GROUP_ESTIMATORS:
        problems.append(f"--algo.advantage.estimator {args.algo.advantage.estimator}: Cooper uses a group baseline "
                        f"over each prompt's rollouts, one of {list(GROUP_ESTIMATORS)} (group_norm = GRPO, as in the "
                        "paper); gae needs a critic, reinforce and flash_reinforce have no per-prompt baseline")
    if args.train.async_enable:
        problems.append("--train.async_enable is not supported: the Cooper step is synchronous (rewards of step "
                        "t+1 come from the RM updated at step t)")
    if needs_rm and (args.ds.ring_attn_size > 1 or args.ds.tensor_parallel_size > 1):
        problems.append("--ds.ring_attn_size / --ds.tensor_parallel_size > 1 are not supported by the Cooper RM "
                        "actor (plain data parallel); keep them at 1")

    if not 0.0 < cooper.reward_threshold < 1.0:
        problems.append(f"--cooper.reward_threshold must be in (0, 1), got {cooper.reward_threshold}")
    if cooper.assistant == "model" and not cooper.assistant_model_path:
        problems.append("--cooper.assistant model needs --cooper.assistant_model_path")
    if cooper.assistant == "policy" and cooper.assistant_model_path:
        problems.append("--cooper.assistant_model_path is set but --cooper.assistant is 'policy'; pass "
                        "--cooper.assistant model to use it")
    if cooper.assistant == "model" and not getattr(args, "remote_rm_trainable", False):
        problems.append("--cooper.assistant model starts an engine for the RM's negatives, which only "
                        "--remote_rm_trainable asks for; drop it or add --remote_rm_trainable")
    source = NEGATIVE_SOURCES[cooper.negative_source]
    if not source.writes_rewrites and cooper.assistant == "model":
        problems.append(f"--cooper.assistant model is never used with --cooper.negative_source {source.name} (it "
                        "asks no assistant for rewrites); drop it or use --cooper.negative_source mixed")
    if cooper.offline_pairs is not None:
        if not getattr(args, "remote_rm_trainable", False):
            problems.append("--cooper.offline_pairs feeds the RM update, which needs --remote_rm_trainable")
        if not os.path.isfile(cooper.offline_pairs):
            problems.append(f"--cooper.offline_pairs {cooper.offline_pairs}: no such file")
    if cooper.negative_validity != "strict" and not source.writes_rewrites:
        problems.append(f"--cooper.negative_validity {cooper.negative_validity} judges the assistant's rewrites, and "
                        f"--cooper.negative_source {source.name} asks for none; use assistant or mixed")
    if cooper.answerless_negatives and not source.reads_rollouts:
        problems.append("--cooper.answerless_negatives picks among the policy's own rollouts and is never used with "
                        f"--cooper.negative_source {source.name}; use rollout or mixed")
    positive_ints = ("rm_updates_per_step", "rm_mini_batch_size", "rm_micro_batch_size", "rm_score_batch_size",
                     "negative_retries", "negative_max_new_tokens", "verifier_workers")
    for name in positive_ints:
        if getattr(cooper, name) < 1:
            problems.append(f"--cooper.{name} must be >= 1, got {getattr(cooper, name)}")
    if cooper.rm_max_length is not None and cooper.rm_max_length < 16:
        problems.append(f"--cooper.rm_max_length must be >= 16 tokens, got {cooper.rm_max_length}")
    if not cooper.rm_lr > 0:
        problems.append(f"--cooper.rm_lr must be > 0, got {cooper.rm_lr}")
    if cooper.rm_weight_decay < 0 or cooper.rm_max_norm < 0:
        problems.append("--cooper.rm_weight_decay and --cooper.rm_max_norm must be >= 0")
    if not 0.0 <= cooper.rm_warmup_ratio < 1.0:
        problems.append(f"--cooper.rm_warmup_ratio must be in [0, 1), got {cooper.rm_warmup_ratio}")
    if not cooper.negative_temperature >= 0:
        problems.append(f"--cooper.negative_temperature must be >= 0, got {cooper.negative_temperature}")
    if not cooper.verifier_deadline_s > 0:
        problems.append(f"--cooper.verifier_deadline_s must be > 0, got {cooper.verifier_deadline_s}")
    try:
        HackingMonitorConfig.from_namespace(cooper)
    except ValueError as exc:
        problems.append(str(exc))
    try:
        GuardConfig.from_namespace(cooper)
    except ValueError as exc:
        problems.append(f"--cooper.{exc}" if str(exc).startswith("rm_guard") else str(exc))
    if cooper.rm_anchors is not None and not os.path.isfile(cooper.rm_anchors):
        problems.append(f"--cooper.rm_anchors {cooper.rm_anchors}: no such file")
    if cooper.rm_anchor_weight < 0 or cooper.rm_anchor_rows < 0 or cooper.rm_anchor_batch < 1 \
            or cooper.rm_anchor_probe_problems < 0:
        problems.append("--cooper.rm_anchor_weight, rm_anchor_rows and rm_anchor_probe_problems must be >= 0, "
                        "--cooper.rm_anchor_batch >= 1")
    if cooper.rm_anchor_weight not in (0, ANCHOR_WEIGHT) and not args.remote_rm_trainable:  # the default asks nothing
        problems.append("--cooper.rm_anchor_weight anchors the RM's updates, which need --remote_rm_trainable")
    if cooper.rm_eval_dataset and not rm_path:
        problems.append("--cooper.rm_eval_dataset needs a reward model (--reward.model_name_or_path) to evaluate")
    if cooper.rm_eval_dataset and args.eval.steps in (-1, 0, None):
        problems.append("--cooper.rm_eval_dataset is evaluated every --eval.steps steps; set --eval.steps >= 1")
    if not 0.0 <= cooper.max_unparseable_reference_share <= 1.0:
        problems.append(f"--cooper.max_unparseable_reference_share must be in [0, 1], got "
                        f"{cooper.max_unparseable_reference_share}")
    if cooper.rm_save_path and not args.remote_rm_trainable:
        problems.append("--cooper.rm_save_path is only used with --remote_rm_trainable (a static RM is not re-saved)")
    problems += batch_problems(args) + secret_problems(args)
    problems += device_problems(args, cuda)
    _fail(problems)


def batch_problems(args) -> list[str]:
    """OpenRLHF's "The number of sample batches must be greater than or equal to the effective number of actor
    processes" (train_ppo_ray.py's validation), said with the flags that fix it: each actor rank takes at least one
    micro-batch of every rollout step's samples."""
    rollout, actor, ds = args.rollout, args.actor, args.ds
    samples = rollout.n_samples_per_prompt * rollout.batch_size
    ranks = actor.num_nodes * actor.num_gpus_per_node // ds.ring_attn_size // ds.tensor_parallel_size
    if rollout.micro_batch_size < 1 or samples // rollout.micro_batch_size >= ranks:
        return []
    return [f"--rollout.micro_batch_size {rollout.micro_batch_size}: --rollout.batch_size {rollout.batch_size} x "
            f"--rollout.n_samples_per_prompt {rollout.n_samples_per_prompt} = {samples} samples per rollout step make "
            f"{samples // rollout.micro_batch_size} micro-batch(es), fewer than the {ranks} actor processes "
            f"(--actor.num_nodes x --actor.num_gpus_per_node), each of which needs one (OpenRLHF: \"the number of "
            f"sample batches must be >= the effective number of actor processes\"); use --rollout.micro_batch_size "
            f"<= {max(1, samples // ranks)} (launchers: ROLLOUT_MICRO_BATCH_SIZE)"]


def secret_problems(args, environ=None) -> list[str]:
    """A wandb key given as `env:NAME` (what the launchers pass) needs NAME set where the run starts."""
    import os

    from cooper_openrlhf.runtime.secrets import MissingSecretError, resolve_env_reference

    try:
        resolve_env_reference("--logger.wandb.key", args.logger.wandb.key, os.environ if environ is None else environ)
    except MissingSecretError as exc:
        return [f"{exc} (export the wandb key there, as wandb reads it)"]
    return []


def device_problems(args, cuda: bool | None = None) -> list[str]:
    """Flags the device cannot serve: CPU-only options on a GPU run, and the RM optimizer DeepSpeed would pick
    that cannot skip a non-finite step. cuda: whether this run's actors have CUDA (default: `run_on_gpus()`, as the
    dtype is resolved: a driver on a CPU-only head node of a GPU cluster judges for the GPUs)."""
    from cooper_openrlhf.runtime.dtype import DtypeError, resolve_dtype_name
    from cooper_openrlhf.runtime.ray_cluster import run_on_gpus

    cuda = run_on_gpus() if cuda is None else cuda
    problems = []
    if cuda and args.vllm.sync_backend == "gloo":
        problems.append("--vllm.sync_backend gloo is this package's CPU weight sync; on GPU use nccl (OpenRLHF's "
                        "default)")
    try:
        dtype = resolve_dtype_name(args.ds.param_dtype, cuda)
    except DtypeError as exc:
        problems.append(f"--ds.param_dtype {args.ds.param_dtype}: {exc}")
        dtype = None
    if (args.remote_rm_trainable and args.cooper.rm_zero_stage == 1 and dtype == "bf16"
            and args.ds.grad_accum_dtype == "fp32" and not args.ds.adam_offload):
        # deepspeed/runtime/engine.py `_do_optimizer_sanity_check`: this combination selects BF16_Optimizer,
        # which asserts on non-finite gradients where ZeRO's optimizer skips the step (reward_actor.py relies on it).
        problems.append("--cooper.rm_zero_stage 1 with bf16 params and --ds.grad_accum_dtype fp32 makes DeepSpeed "
                        "use its BF16_Optimizer for the RM, which fails instead of skipping a step with non-finite "
                        "gradients; use --cooper.rm_zero_stage 2, or drop --ds.grad_accum_dtype fp32")
    return problems
