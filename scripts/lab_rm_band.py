"""The starting-RM band: the lab's RM recipe at several (epochs, learning rate), each probed (docs/lab.md).

The static arm shows the paper's signature (RM reward up, accuracy down) only if its RM pays some wrong output
the policy can reach above what the policy earns now (lab/rm_probe.py: the break-even accuracy). This trains the preset's starting VerifyRM exactly as the lab does
(`lab.prepare.prepare_rm`, on the lab folder's rm_triples.jsonl) at each recipe, and probes each RM
(`lab.rm_probe`, as `cli.probe_rm`), printing one markdown row per recipe. Finished recipes are reused.

    python -m cooper_openrlhf.cli.lab --preset full --prepare-only --out runs/lab-full    # the task data
    python scripts/lab_rm_band.py runs/lab-full runs/rm-band [--preset full] [--recipes 1:2e-4,2:2e-4]
    python scripts/lab_rm_band.py runs/lab-full runs/rm-band-elsewhere --wrong-elsewhere --recipes 1:2e-4,2:2e-4

--wrong-elsewhere asks whether a spurious cue gives the RM a blind spot: the policy's answer sentence ("The answer
is N.") then carries only right answers in the RM's data (each wrong answer written in it moves to another of
the data's templates, so both labels keep their counts), as if the RM's correct examples came from a model that
writes like the policy. docs/lab.md ("After run 3") gives what it did.

--right-share P asks whether a skewed label prior does: the RM's data keep every right row and only as many wrong
rows as make right a share P of them, as if the completions came from models that mostly solve these problems
(the paper's VerifyRM data were sampled from capable models). An RM that learned "mostly right" as its prior may
pay text it has no opinion about, such as a completion with no answer, by that prior.
"""

import argparse
import json
import random
from pathlib import Path

from cooper_openrlhf.lab.prepare import prepare_rm, probe_preset_rm
from cooper_openrlhf.lab.presets import PRESETS
from cooper_openrlhf.lab.task import COMPLETION_TEMPLATES
from cooper_openrlhf.lab.warm_start import ANSWER_SENTENCE

# From the lab's recipe (1 epoch at 2e-4, run 2) towards run 1's (2 epochs at 2e-4), and gentler learning rates.
DEFAULT_RECIPES = "1:1e-4,1:2e-4,1:4e-4,2:5e-5,2:1e-4,2:2e-4,3:5e-5"


def wrong_answers_elsewhere(rows: list[dict], seed: int = 0) -> list[dict]:
    """`rows` with every wrong answer written in the policy's sentence moved into another completion template."""
    stem = ANSWER_SENTENCE.split("{answer}")[0]
    others = [t for t in COMPLETION_TEMPLATES if not t.startswith(stem)]
    rng, moved = random.Random(seed), []
    for row in rows:
        if row["label"] == 0 and row["completion"].startswith(stem):
            wrong = row["completion"][len(stem):].rstrip(".")
            row = {**row, "completion": rng.choice(others).format(question=row["question"], answer=wrong)}
        moved.append(row)
    return moved


def right_share(rows: list[dict], share: float, seed: int = 0) -> list[dict]:
    """Every right row of `rows` and a seeded sample of the wrong ones, so that right rows are `share` of the result."""
    wrong = [i for i, row in enumerate(rows) if row["label"] == 0]
    right = len(rows) - len(wrong)
    keep = set(random.Random(seed).sample(wrong, min(len(wrong), round(right * (1 - share) / share))))
    return [row for i, row in enumerate(rows) if row["label"] == 1 or i in keep]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lab", type=Path, help="a lab folder holding data/rm_triples.jsonl")
    parser.add_argument("out", type=Path, help="where the RMs and band.json go")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--recipes", default=DEFAULT_RECIPES, help="epochs:lr, comma-separated")
    parser.add_argument("--wrong-elsewhere", action="store_true",
                        help="no wrong answer in the policy's answer sentence in the RM's data (module docstring)")
    parser.add_argument("--right-share", type=float, default=None,
                        help="keep only enough wrong rows that right ones are this share of the RM's data (docstring)")
    args = parser.parse_args()
    data = args.lab / "data" / "rm_triples.jsonl"
    if not data.is_file():
        parser.error(f"{data} is missing: prepare the lab first (cli.lab --prepare-only --out {args.lab})")
    if args.wrong_elsewhere or args.right_share is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
        if args.wrong_elsewhere:
            rows = wrong_answers_elsewhere(rows)
        if args.right_share is not None:
            rows = right_share(rows, args.right_share)
        data = args.out / "rm_triples.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    preset, rows = PRESETS[args.preset], []
    print("| epochs | lr | RM accuracy (held-out triples) | right answer paid | wrong answer paid | best answerless text, "
          "paid | break-even accuracy | best-paid output right |\n|---|---|---|---|---|---|---|---|", flush=True)
    for recipe in args.recipes.split(","):
        epochs, lr = recipe.split(":")
        recipe_preset = preset.with_overrides(rm_epochs=int(epochs), rm_lr_pretrain=float(lr))
        rm = prepare_rm(recipe_preset, data, args.out / f"e{epochs}_lr{lr}")
        accuracy = json.loads((rm.parent / "train_summary.json").read_text(encoding="utf-8"))["best"]["accuracy"]
        probe = probe_preset_rm(recipe_preset, rm)
        rows.append({"epochs": int(epochs), "lr": float(lr), "rm_accuracy": accuracy, "probe": probe})
        print(f"| {epochs} | {lr} | {accuracy:.3f} | {probe['truth_reward']:.3f} | {probe['wrong_reward']:.3f} | "
              f"{probe['universal']!r}, {probe['universal_reward']:.3f} | {probe['break_even_accuracy']:.0%} | "
              f"{probe['best_accuracy']:.0%} |", flush=True)
    (args.out / "band.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
