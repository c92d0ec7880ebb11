"""Build a VerifyRM reward model: annotate triples, train the classifier, score files, compare verifiers.

    cooper verifyrm {annotate,train,score,compare} ...   # = python -m cooper_openrlhf.cli.verifyrm

  annotate  sample k completions per question from each generator, label them with math-verify and an LLM
            judge, keep the triples where both agree (resumable; see rm/annotate.py)
  train     BCE-train a one-logit classifier on the labelled triples with OpenRLHF's DeepspeedStrategy,
            evaluate every epoch, export the best epoch (see rm/bce_train.py). OpenRLHF flags
            (--ds.zero_stage, --ds.param_dtype [auto (default) | bf16 | fp32 | fp16 on GPU], --train.batch_size,
            --train.micro_batch_size, --train.seed, --ds.adam_offload, ...) are passed to OpenRLHF's own parser. Runs as one CPU
            process, or under `deepspeed --module cooper_openrlhf.cli.verifyrm train ...` / torchrun.
  score     add the reward (sigmoid of the RM logit) and the logit to every row of a JSON Lines file
  compare   one table: the RM, math-verify alone and the judge alone against gold labels

Bad input (a missing field, an empty reference, a model that does not load, a one-class training set)
ends the command with exit status 2 and a message naming the file, line and field or the model.
"""

import argparse
import json
import logging
import os
import sys

from cooper_openrlhf.engines import ENGINE_KINDS
from cooper_openrlhf.rm.bce_train import BEST_METRICS
from cooper_openrlhf.rm.compare import GOLD_SOURCES
from cooper_openrlhf.rm.data import PROMPT_FORMATS, RecipeDataError

EXIT_BAD_INPUT = 2


def _engine_options(args) -> dict:
    options = {}
    if args.engine == "hf":
        options = {"device": args.device, "batch_size": args.engine_batch_size}
    for item in args.engine_option or []:
        key, _, value = item.partition("=")
        if not key or not _:
            raise SystemExit(f"--engine-option takes KEY=VALUE (VALUE as JSON when it parses), got {item!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", default="hf", choices=ENGINE_KINDS, help="generation engine for generators and judge")
    parser.add_argument("--device", default="cpu", help="hf engine: torch device")
    parser.add_argument("--engine-batch-size", type=int, default=16, help="hf engine: prompts per generate call")
    parser.add_argument("--engine-option", action="append", metavar="KEY=VALUE",
                        help="extra engine argument, repeatable (vllm: e.g. gpu_memory_utilization=0.4, max_model_len=4096)")


# verifyrm train's flags before they took OpenRLHF train_rm's names: (old, new, type). Accepted for one release
# with a deprecation line; giving both names of one setting is an error.
DEPRECATED_TRAIN_FLAGS = (
    ("--pretrain", "--model.model_name_or_path", str), ("--data", "--data.dataset", str),
    ("--eval-data", "--eval.dataset", str), ("--out", "--ckpt.output_dir", str), ("--epochs", "--train.max_epochs", int),
    ("--lr", "--adam.lr", float), ("--weight-decay", "--adam.weight_decay", float),
    ("--lr-scheduler", "--lr_scheduler", str), ("--warmup-ratio", "--lr_warmup_ratio", float),
    ("--min-lr-ratio", "--min_lr_ratio", float), ("--max-norm", "--max_norm", float),
    ("--max-length", "--data.max_len", int),
)
REQUIRED_TRAIN_FLAGS = ("--model.model_name_or_path", "--data.dataset", "--ckpt.output_dir")


def resolve_train_flags(parser, args, argv: list[str]) -> None:
    """Move deprecated names onto train_rm's (one stderr line each); both names of one setting, or a missing required
    flag, end with the parser's usage error naming them."""
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    for old, new, _ in DEPRECATED_TRAIN_FLAGS:
        value = getattr(args, f"deprecated:{old}")
        if value is None:
            continue
        if new in given:
            parser.error(f"{old} and {new} name the same setting; give only {new}")
        print(f"verifyrm train: {old} is deprecated, use {new} (OpenRLHF train_rm's name); accepted for one release",
              file=sys.stderr)
        setattr(args, new.lstrip("-"), value)
    missing = [flag for flag in REQUIRED_TRAIN_FLAGS if getattr(args, flag.lstrip("-")) is None]
    if missing:
        parser.error(f"verifyrm train needs {', '.join(missing)}")


PROG = "cooper verifyrm"  # `python -m cooper_openrlhf.cli.verifyrm` runs the same command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    annotate = commands.add_parser("annotate", help="generate and hybrid-label triples")
    source = annotate.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help="JSON Lines file of questions with reference answers")
    source.add_argument("--synthetic", type=int, metavar="N", help="use N built-in synthetic arithmetic problems")
    annotate.add_argument("--format", default="auto", choices=PROMPT_FORMATS,
                          help="--prompts format: auto (default) = told from the first row's keys; plain = {question, reference}; "
                               "question-answer = {question, answer}; or a benchmark's own format")
    annotate.add_argument("--synthetic-seed", type=int, default=0, help="seed of the synthetic problems")
    annotate.add_argument("--limit", type=int, help="use only the first N prompts")
    annotate.add_argument("--generator", action="append", required=True, help="generator model path, repeatable")
    annotate.add_argument("--judge", required=True, help="judge model path")
    annotate.add_argument("--out", required=True, help="output JSON Lines; side files are named after it")
    annotate.add_argument("--samples-per-question", "-k", type=int, default=4, help="completions per question per generator")
    annotate.add_argument("--max-new-tokens", type=int, default=256, help="generator completion length")
    annotate.add_argument("--temperature", type=float, default=0.8)
    annotate.add_argument("--top-p", type=float, default=0.95)
    annotate.add_argument("--judge-max-new-tokens", type=int, default=64)
    annotate.add_argument("--chunk-size", type=int, default=8, help="questions per chunk (unit of progress and seeding)")
    annotate.add_argument("--seed", type=int, default=0, help="sampling seed")
    annotate.add_argument("--verifier-workers", type=int, default=1, help="math-verify worker processes")
    annotate.add_argument("--verifier-timeout", type=float, default=5.0, help="hard deadline per verification, seconds")
    _add_engine_flags(annotate)

    train = commands.add_parser("train", help="BCE-train a VerifyRM (OpenRLHF train_rm's flag names; unknown "
                                "--ds.*/--train.* flags go to OpenRLHF)")
    train.add_argument("--model.model_name_or_path", help="backbone or reward model folder (required)")
    train.add_argument("--init-head", action="store_true",
                       help="the backbone has no one-logit classification head (causal LM, bare encoder): add a new one")
    train.add_argument("--data.dataset", help="labelled JSON Lines, annotate's output (required)")
    train.add_argument("--eval.dataset", help="held-out labelled JSON Lines (default: split --data.dataset by question)")
    train.add_argument("--eval-fraction", type=float, default=0.2, help="share of questions held out when splitting")
    train.add_argument("--split-seed", type=int, default=0)
    train.add_argument("--ckpt.output_dir", help="run folder: best/, metrics.jsonl, tensorboard/, train_summary.json "
                       "(required)")
    train.add_argument("--train.max_epochs", type=int, default=3)
    train.add_argument("--adam.lr", type=float, default=2e-5)
    train.add_argument("--adam.weight_decay", type=float, default=0.0)
    train.add_argument("--lr_scheduler", default="cosine_with_min_lr", help="a transformers scheduler name")
    train.add_argument("--lr_warmup_ratio", type=float, default=0.1, help="share of optimizer steps spent warming up")
    train.add_argument("--min_lr_ratio", type=float, default=0.1, help="cosine_with_min_lr: final lr / lr")
    train.add_argument("--max_norm", type=float, default=1.0, help="gradient clipping")
    train.add_argument("--data.max_len", type=int, default=1024,
                       help="tokens per RM input (capped at the model's positions)")
    train.add_argument("--eval-batch-size", type=int, default=16)
    train.add_argument("--best-metric", default="accuracy", choices=BEST_METRICS,
                       help="eval metric that picks the exported epoch (ties: lower eval loss)")
    train.add_argument("--logger.tensorboard_dir", help="tensorboard folder (default: <output_dir>/tensorboard)")
    train.add_argument("--no-tensorboard", action="store_true", help="write metrics.jsonl only")
    train.add_argument("--logger.wandb.key", help="log to Weights & Biases too (the API key; WANDB_MODE applies)")
    train.add_argument("--logger.wandb.project", default="cooper_verifyrm")
    train.add_argument("--logger.wandb.run_name", default=None, help="default: the output folder's name")
    for old, new, kind in DEPRECATED_TRAIN_FLAGS:  # the names before train_rm's, kept for one release
        train.add_argument(old, dest=f"deprecated:{old}", type=kind, default=None, help=argparse.SUPPRESS)

    score = commands.add_parser("score", help="batch-score (question, reference, completion) rows")
    score.add_argument("--model", required=True, help="reward model folder (a VerifyRM export or any one-logit classifier)")
    score.add_argument("--data", required=True, help="JSON Lines with question, reference, completion")
    score.add_argument("--out", required=True, help="the same rows with `reward` and `logit` added")
    score.add_argument("--batch-size", type=int, default=16)
    score.add_argument("--max-length", type=int, help="tokens per input (default: what the export records)")
    score.add_argument("--device", default="cpu")

    comp = commands.add_parser("compare", help="RM vs math-verify vs judge against gold labels, one table")
    comp.add_argument("--data", action="append", required=True,
                      help="labelled JSON Lines, repeatable (e.g. annotate's kept and rejected files)")
    comp.add_argument("--model", required=True, help="reward model folder")
    comp.add_argument("--gold", default="label", choices=GOLD_SOURCES,
                      help="where gold labels come from (see rm/compare.py)")
    comp.add_argument("--judge", help="re-run this judge model (default: read the rows' recorded judge_verdict)")
    comp.add_argument("--judge-max-new-tokens", type=int, default=64)
    comp.add_argument("--threshold", type=float, default=0.5, help="RM: correct when sigmoid(logit) >= this")
    comp.add_argument("--batch-size", type=int, default=16, help="RM inputs per forward pass")
    comp.add_argument("--max-length", type=int)
    comp.add_argument("--verifier-workers", type=int, default=1)
    comp.add_argument("--verifier-timeout", type=float, default=5.0)
    comp.add_argument("--json-out", help="also write the report as JSON")
    comp.add_argument("--verifybench-out", help="also write the rows with their gold as VerifyBench JSON Lines "
                      "(for `cooper inspect eval-verifier`)")
    _add_engine_flags(comp)
    return parser


def run_annotate(args) -> int:
    from cooper_openrlhf.rm.annotate import AnnotateConfig, annotate, format_summary
    from cooper_openrlhf.rm.data import load_prompts, synthetic_prompts

    if args.prompts:
        problems = load_prompts(args.prompts, args.format, args.limit)
    else:
        problems = synthetic_prompts(args.synthetic, args.synthetic_seed)[: args.limit]
    config = AnnotateConfig(
        generators=tuple(args.generator), judge=args.judge, engine=args.engine,
        samples_per_question=args.samples_per_question, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_p=args.top_p, judge_max_new_tokens=args.judge_max_new_tokens,
        chunk_size=args.chunk_size, seed=args.seed, verifier_timeout_s=args.verifier_timeout,
        engine_options=_engine_options(args),
    )
    summary = annotate(problems, config, args.out, verifier_workers=args.verifier_workers)
    print(format_summary(summary))
    return 0


def run_train(args, openrlhf_argv: list[str]) -> int:
    from cooper_openrlhf.rm.bce_train import TrainConfig, train
    from cooper_openrlhf.runtime.secrets import resolve_env_reference

    flag = vars(args)  # dotted names: OpenRLHF's
    config = TrainConfig(
        pretrain=flag["model.model_name_or_path"], data=flag["data.dataset"], out=flag["ckpt.output_dir"],
        eval_data=flag["eval.dataset"], eval_fraction=args.eval_fraction, split_seed=args.split_seed,
        init_head=args.init_head, epochs=flag["train.max_epochs"], lr=flag["adam.lr"], lr_scheduler=args.lr_scheduler,
        warmup_ratio=args.lr_warmup_ratio, min_lr_ratio=args.min_lr_ratio, weight_decay=flag["adam.weight_decay"],
        max_norm=args.max_norm, max_length=flag["data.max_len"], eval_batch_size=args.eval_batch_size,
        best_metric=args.best_metric, tensorboard=not args.no_tensorboard,
        # `env:WANDB_API_KEY` (what the launcher passes): the key from the environment, never on the command line
        tensorboard_dir=flag["logger.tensorboard_dir"],
        wandb_key=resolve_env_reference("--logger.wandb.key", flag["logger.wandb.key"], os.environ),
        wandb_project=flag["logger.wandb.project"], wandb_run_name=flag["logger.wandb.run_name"],
    )
    summary = train(config, openrlhf_argv)
    import torch.distributed as dist

    if dist.get_rank() == 0:
        best = summary["best"]
        print(f"best epoch {best['epoch']}: eval accuracy {best['accuracy']:.4f} f1 {best['f1']:.4f} "
              f"loss {best['loss']:.4f} on {best['n']} rows -> {summary['best_checkpoint']}")
    dist.destroy_process_group()
    return 0


def run_score(args) -> int:
    import torch

    from cooper_openrlhf.algo.rewards import probability_correct
    from cooper_openrlhf.rm.data import load_for_scoring
    from cooper_openrlhf.rm.scorer import RMScorer

    rows = load_for_scoring(args.data)
    scorer = RMScorer.load(args.model, device=args.device, max_length=args.max_length, batch_size=args.batch_size)
    logits = scorer.logits([r.question for r in rows], [r.reference for r in rows], [r.completion for r in rows])
    rewards = probability_correct(torch.tensor(logits, dtype=torch.float64)).tolist()
    with open(args.out, "w", encoding="utf-8") as out:
        for item, logit, reward in zip(rows, logits, rewards):
            out.write(json.dumps({**item.row, "reward": reward, "logit": logit}) + "\n")
    print(f"scored {len(rows)} rows with {args.model} (template {scorer.template_version}) -> {args.out}")
    return 0


def run_compare(args) -> int:
    from cooper_openrlhf.rm import compare as cmp
    from cooper_openrlhf.rm.data import load_for_scoring

    rows = [item for path in args.data for item in load_for_scoring(path)]
    gold = cmp.gold_labels(rows, args.gold)
    predictions = {
        "math-verify": cmp.rule_predictions(rows, args.verifier_workers, args.verifier_timeout),
        "judge": cmp.judge_predictions(rows, args.judge, args.engine, args.judge_max_new_tokens, _engine_options(args)),
        "verifyrm": cmp.rm_predictions(rows, args.model, args.threshold, args.batch_size, args.max_length, args.device),
    }
    result = cmp.compare(rows, gold, predictions, args.gold)
    print(f"data={','.join(args.data)} rows={len(rows)} model={args.model}")
    print(cmp.format_comparison(result))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump({"data": args.data, "model": args.model, **result.to_dict()}, out, indent=2)
    if args.verifybench_out:
        with open(args.verifybench_out, "w", encoding="utf-8") as out:
            for item, is_correct in zip(rows, gold):
                out.write(json.dumps({"question": item.question, "answer": item.reference,
                                      "completion": item.completion, "gold_correct": is_correct}) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.runtime.toolchain import ready_for_op_builds

    ready_for_op_builds()  # `train` builds DeepSpeed's optimizer op in this process
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    openrlhf_argv = []
    if args.command == "train":
        resolve_train_flags(parser, args, list(argv if argv is not None else sys.argv[1:]))
        openrlhf_argv = unknown
        strays = [a for a in unknown if a.startswith("--") and not a.startswith(("--ds.", "--train.", "--local_rank"))]
        if strays:
            parser.error(f"unrecognized arguments: {' '.join(strays)} "
                         f"(train forwards only --ds.*, --train.* and --local_rank to OpenRLHF)")
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from cooper_openrlhf.models.paths import ModelNotMaterializedError
    from cooper_openrlhf.runtime.secrets import MissingSecretError
    from cooper_openrlhf.rm.annotate import AnnotateError
    from cooper_openrlhf.rm.model import NotASequenceClassifierError

    try:
        if args.command == "annotate":
            return run_annotate(args)
        if args.command == "train":
            return run_train(args, openrlhf_argv)
        if args.command == "score":
            return run_score(args)
        return run_compare(args)
    except (RecipeDataError, AnnotateError, NotASequenceClassifierError, ModelNotMaterializedError,
            FileNotFoundError, MissingSecretError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
