"""Prompt data for the RL arms: the question with the answer-format instruction appended, and its reference.

`python -m cooper_openrlhf.cluster.prompts --input gsm8k/train.jsonl --format gsm8k --out prompts.jsonl`

Why a data step: with `--data.apply_chat_template` OpenRLHF renders the prompt field through the chat
template and ignores `--data.input_template`, so an instruction given there never reaches the policy.
The official recipe (verl's GSM8K preprocessing, which ZJU-REAL/Cooper's script trains on) puts it in
the question itself: question + " " + instruction. The RM then sees the same text as the question, as in
the official recipe (its RM template reads the chat's first user turn).

Instructions (`--instruction`): `gsm8k-verl` (default, the official recipe's) asks for the answer after
"####"; `boxed` is the evaluation's (cli/evaluate, Qwen2.5-Math's) \\boxed{} instruction; `--instruction-text`
gives any other. Rows written: {"question": text + instruction, "answer": reference, "instruction": name,
"source": input file, "index": row}; the `instruction` field tells the launcher's check the file is prepared.
"""

import argparse
import json
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


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.rm.data import PROMPT_FORMATS, RecipeDataError, load_prompts

    parser = argparse.ArgumentParser(prog="python -m cooper_openrlhf.cluster.prompts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="JSON Lines of questions with reference answers")
    parser.add_argument("--format", default="plain", choices=PROMPT_FORMATS,
                        help="plain = {question, reference} rows, or a benchmark's own format (gsm8k: answer after ####)")
    parser.add_argument("--out", required=True, help="the prompt file for PROMPTS= of the RL launcher")
    parser.add_argument("--instruction", default="gsm8k-verl", choices=sorted(INSTRUCTIONS),
                        help="answer-format instruction appended to every question")
    parser.add_argument("--instruction-text", help="a custom instruction (overrides --instruction)")
    parser.add_argument("--limit", type=int, help="only the first N rows")
    args = parser.parse_args(argv)
    name, text = ("custom", args.instruction_text) if args.instruction_text else (args.instruction, INSTRUCTIONS[args.instruction])
    try:
        problems = load_prompts(args.input, args.format, args.limit)
    except RecipeDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with open(args.out, "w", encoding="utf-8") as handle:
        for row in prepare_rows(problems, name, text):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(problems)} prompts with the {name!r} instruction to {args.out} "
          "(RL launcher: PROMPTS=that file INPUT_KEY=question LABEL_KEY=answer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
