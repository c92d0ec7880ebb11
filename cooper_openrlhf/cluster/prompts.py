"""Prompt data for the RL arms: the question with the answer-format instruction appended, and its reference.

`cooper prompts --input my_problems.jsonl --out prompts.jsonl` (= python -m cooper_openrlhf.cluster.prompts)

Input: JSON Lines (or JSON, Parquet), one problem per row: a question and its final answer, e.g.
{"question": "What is 2 + 3?", "reference": "5"}, or a common dataset's own keys, told from the first row
(`rm.data.detect_prompt_format`): {question, answer} (GSM8K's "... #### 72" answers too), {problem, answer} (MATH500,
DeepScaleR), {Body, Question, Answer} (SVAMP), {question, final_answer} (OlympiadBench); `--format` forces one.

Why a data step: with `--data.apply_chat_template` OpenRLHF renders the prompt field through the chat
template and ignores `--data.input_template`, so an instruction given there never reaches the policy.
The official recipe (verl's GSM8K preprocessing, which ZJU-REAL/Cooper's script trains on) puts it in
the question itself: question + " " + instruction. The RM then sees the same text as the question, as in
the official recipe (its RM template reads the chat's first user turn).

Instructions (`--instruction`): `gsm8k-verl` (default, the official recipe's) asks for the answer after
"####"; `boxed` is the evaluation's (cli/evaluate, Qwen2.5-Math's) \\boxed{} instruction; `--instruction-text`
gives any other. Rows written: {"question": text + instruction, "answer": reference, "instruction": name,
"source": input file, "index": row}; the `instruction` field tells the launcher's check the file is prepared.

Held-out split (`--heldout N --heldout-out FILE`): N rows drawn with a fixed seed (`--split-seed`) go to FILE, in
the same format, and never into --out: the RL launcher's EVAL_PROMPTS (`--eval.dataset`), whose accuracy every
EVAL_STEPS steps is the held-out curve of the report and of the hacking alarm's held-out rule.
"""

import argparse
import json
import random
import sys

INSTRUCTIONS = {
    "gsm8k-verl": "Let's think step by step and output the final answer after \"####\".",
    "boxed": "Please reason step by step, and put your final answer within \\boxed{}.",
}


def with_instruction(question: str, instruction: str) -> str:
    """The question followed by one space and the instruction (verl's GSM8K preprocessing)."""
    question = question.strip()
    if not question:
        raise ValueError("empty question")
    return f"{question} {instruction}" if instruction else question


def prepare_rows(problems, instruction_name: str, instruction: str) -> list[dict]:
    """OpenRLHF prompt rows (input key `question`, label key `answer`) from `data.records.MathProblem`s."""
    return [{"question": with_instruction(p.question, instruction), "answer": p.reference,
             "instruction": instruction_name, "source": p.source, "index": p.index} for p in problems]


def write_rows(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.rm.data import PROMPT_FORMATS, RecipeDataError, load_prompts

    parser = argparse.ArgumentParser(prog="cooper prompts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="JSON Lines of questions with reference answers")
    parser.add_argument("--format", default="auto", choices=PROMPT_FORMATS,
                        help="auto (default): told from the first row's keys (README, quick start 2); plain = {question, "
                             "reference}; question-answer = {question, answer}; or a benchmark's own format (gsm8k: "
                             "answer after ####)")
    parser.add_argument("--out", required=True, help="the prompt file for PROMPTS= of the RL launcher")
    parser.add_argument("--instruction", default="gsm8k-verl", choices=sorted(INSTRUCTIONS),
                        help="answer-format instruction appended to every question")
    parser.add_argument("--instruction-text", help="a custom instruction (overrides --instruction)")
    parser.add_argument("--limit", type=int, help="only the first N rows")
    parser.add_argument("--heldout", type=int, default=0, help="rows kept out of --out for held-out evaluation")
    parser.add_argument("--heldout-out", help="where the held-out rows go (needed with --heldout)")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the held-out draw")
    args = parser.parse_args(argv)
    if args.heldout and not args.heldout_out:
        parser.error("--heldout needs --heldout-out FILE")
    name, text = ("custom", args.instruction_text) if args.instruction_text else (args.instruction, INSTRUCTIONS[args.instruction])
    try:
        problems = load_prompts(args.input, args.format, args.limit)
    except RecipeDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = prepare_rows(problems, name, text)
    if args.heldout:
        if not 0 < args.heldout < len(rows):
            print(f"error: --heldout {args.heldout}: must leave at least one of the {len(rows)} rows for training",
                  file=sys.stderr)
            return 2
        held = set(random.Random(args.split_seed).sample(range(len(rows)), args.heldout))
        write_rows(args.heldout_out, [row for i, row in enumerate(rows) if i in held])
        rows = [row for i, row in enumerate(rows) if i not in held]
        print(f"wrote {len(held)} held-out prompts to {args.heldout_out} (EVAL_PROMPTS)")
    write_rows(args.out, rows)
    print(f"wrote {len(rows)} prompts with the {name!r} instruction to {args.out} "
          "(RL launcher: PROMPTS=that file INPUT_KEY=question LABEL_KEY=answer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
