"""Probe reward models: what would a policy maximising each RM write?

    cooper inspect probe-rm RM... [--preset full]   # = python -m cooper_openrlhf.cli.probe_rm

Scores lab/rm_probe.py's candidate outputs (right, wrong, answerless, hedged answers in the preset's policy's
answer sentence, and every constant answer) on the preset's RL prompts and prints, per RM, the one-line verdict
and a table per kind; with `--accuracy A` also the climb on offer to a policy right on A of the prompts (what the
lab's pair stage chooses by), and with `--require-answer` as the format gate pays (answerless text 0). The
lab runs the same probe on its starting RM (verifyrm/probe.json, lab.json); this command probes any RM folder,
for instance a Cooper run's co-trained RM (`<run>/final/rm`) or a candidate starting RM before a lab is run.

Every RM also gets the RM guard's health and attack table (`core/rm_health.py`, what training would log as
cooper/rm_health/*): AUC of right against wrong anchors, their mean pay, and what each attack form of the probe suite
earns, on the anchors the guard would read (`rm/anchors.py`: --anchors FILE, else eval_split.jsonl beside the RM,
plus the probe suite on --probe-problems held-out problems of the preset, or of --probe-prompts FILE). An RM may
also be a running reward endpoint (`http(s)://HOST:PORT/get_reward`, e.g. `cooper serve`): then only the health
table is printed, from what the endpoint pays (its mode: an RM's sigmoid, or the rule's 0/1), with prompts rendered
by --policy's chat template when the service splits them with one. A learning service groups what it scores: probe
one that does not learn, or whose --heldout-prompts hold the probe questions.
"""

import argparse
import json
import sys
from pathlib import Path

from cooper_openrlhf.lab.presets import PRESETS


PROG = "cooper inspect probe-rm"  # `python -m cooper_openrlhf.cli.probe_rm` runs the same command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("rm", nargs="+", help="reward-model folder(s) (a VerifyRM export) or endpoint URL(s)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full", help="whose prompts and answer sentence")
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    parser.add_argument("--accuracy", type=float, default=None,
                        help="also print the climb on offer to a policy right on this share of the prompts (0-1)")
    parser.add_argument("--require-answer", action="store_true",
                        help="score as --cooper.require_answer pays: answerless text 0")
    parser.add_argument("--anchors", default=None, help="labelled rows for the health table (default: eval_split.jsonl "
                        "beside the RM; none for an endpoint)")
    parser.add_argument("--anchor-rows", type=int, default=64, help="labelled rows the health table reads")
    parser.add_argument("--probe-prompts", default=None, help="problems (rows with input and label) whose probe suite "
                        "joins the anchors (default: the preset's held-out problems)")
    parser.add_argument("--probe-problems", type=int, default=4,
                        help="problems of the probe suite (the guard's default)")
    parser.add_argument("--policy", default=None, help="an endpoint's prompts rendered with this tokenizer's chat "
                        "template (as OpenRLHF's --data.apply_chat_template sends them); default: the question alone")
    parser.add_argument("--token-file", default=None, help="an endpoint's token (sent as Authorization: Bearer)")
    args = parser.parse_args(argv)
    if args.accuracy is not None and not 0.0 <= args.accuracy <= 1.0:
        parser.error(f"--accuracy must be in [0, 1], got {args.accuracy}")
    endpoints = [rm for rm in args.rm if rm.startswith(("http://", "https://"))]
    args.rm = [rm if rm in endpoints else Path(rm) for rm in args.rm]
    missing = [str(p) for p in args.rm if p not in endpoints and not (p / "config.json").is_file()]
    if missing:
        parser.error(f"not a model folder (no config.json): {', '.join(missing)}")
    from cooper_openrlhf.lab.pair_stage import climb_on_offer
    from cooper_openrlhf.lab.prepare import probe_preset_rm
    from cooper_openrlhf.core.rm_health import health_table
    from cooper_openrlhf.lab.rm_probe import format_kinds

    preset = PRESETS[args.preset].with_overrides(require_answer=args.require_answer or None)
    records = []
    for rm in args.rm:
        health = rm_health(rm, preset, args)
        record = {"rm": str(rm)} if rm in endpoints else probe_preset_rm(preset, rm)
        record["health"] = health.as_dict()
        records.append(record)
        if rm in endpoints:
            print(f"{rm}:\n{health_table(health)}\n", flush=True)
            continue
        climb = ("" if args.accuracy is None else
                 f"climb on offer at {args.accuracy:.0%}: {climb_on_offer(record, args.accuracy):+.3f}\n")
        print(f"{rm}: {record['verdict']}\n{climb}{format_kinds(record['kinds'])}\n\nhealth on the guard's anchors:\n"
              f"{health_table(health)}\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    return 0


def rm_health(rm, preset, args):
    """The RM guard's health of `rm` (a folder or an endpoint URL) on the anchors it would read (module docstring)."""
    from cooper_openrlhf.core.rm_health import health_of
    from cooper_openrlhf.lab.task import task_split
    from cooper_openrlhf.rm.anchors import anchor_sets, describe

    if args.probe_prompts:
        from cooper_openrlhf.serve.probing import problems_of

        problems = problems_of(args.probe_prompts)
    else:
        problems = task_split(preset.task)[1]
    folder = None if isinstance(rm, str) else rm
    anchors, _, source = anchor_sets(folder, args.anchors, args.anchor_rows, problems, args.probe_problems)
    print(f"{rm}: {describe(anchors)} ({source})", flush=True)
    texts = ([a.question for a in anchors], [a.reference for a in anchors], [a.completion for a in anchors])
    return health_of(anchors, endpoint_pay(rm, args, *texts) if folder is None else folder_pay(folder, *texts))


def folder_pay(folder, questions, references, completions) -> list[float]:
    """sigmoid(logit) of a VerifyRM folder (its template normalises the completions, as the trainer and the service
    read them)."""
    from cooper_openrlhf.rm.scorer import RMScorer

    return RMScorer.load(str(folder)).score(questions, references, completions)


def endpoint_pay(url: str, args, questions, references, completions, batch: int = 64) -> list[float]:
    """What a reward endpoint pays (OpenRLHF's protocol: query = prompt + completion), in requests of `batch`."""
    from cooper_openrlhf.cli.serve import read_token
    from cooper_openrlhf.clients.http import RewardClient

    prompts = list(questions)
    if args.policy:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.policy)
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                 add_generation_prompt=True) for q in questions]
    client = RewardClient(url, token=read_token(args.token_file))
    paid = []
    for start in range(0, len(prompts), batch):
        part = slice(start, start + batch)
        paid += client.score([p + c for p, c in zip(prompts[part], completions[part])], prompts[part],
                             references[part]).rewards
    return paid


if __name__ == "__main__":
    sys.exit(main())
