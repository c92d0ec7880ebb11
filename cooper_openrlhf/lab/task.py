"""The lab's task: small arithmetic problems, split into RL prompts and a held-out set, and the files built from them.

Every arm and seed reads the same files, written once per lab folder:
  prompts.jsonl     RL prompts ({"input", "label"}): the train split, cycled and shuffled to the step budget
  held_out.jsonl    the held-out split ({"input", "label"}): never an RL prompt; `--eval.dataset` of every arm
  rm_triples.jsonl  the starting VerifyRM's training data: templated right and wrong completions of the
                    train split, each labelled by the rule verifier (not by construction); with
                    `answerless`, also each right completion cut off before its answer (labelled 0: no answer)
  rm_eval.jsonl     the same templates on the held-out split in VerifyBench format (question, answer,
                    completion, gold_correct): `--cooper.rm_eval_dataset`, the RM's accuracy as it trains
The RM reads the policy's prompt text as its <question>, so triples use exactly that text.
"""

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from cooper_openrlhf.algo.answer_style import right_in, wrong_in
from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.data.synthetic import make_arithmetic_problems
from cooper_openrlhf.runtime.registry import Registry

# Completion templates of the starting RM's data ({answer} is the reference or a wrong number). The policy's
# own format ("The answer is N.") is deliberately one of several: the RM generalises to it, imperfectly.
COMPLETION_TEMPLATES = (
    "Let me compute. {question} The result is {answer}. So the answer is \\boxed{{{answer}}}.",
    "We work it out step by step and get {answer}.\nThe final answer is \\boxed{{{answer}}}",
    "{answer}",
    "Answer: {answer}",
    "The answer is {answer}.",
)
WRONG_OFFSETS = (-10, -2, -1, 1, 2, 3, 10)


TASK_FAMILIES = Registry("task family", ("digits", "words"))  # problem_family writes each


@dataclass(frozen=True)
class TaskSpec:
    """Which problems, and how a prompt reads. `family` = "digits" enumerates every a + b and a - b (a >= b) with
    operands in [2, max_operand]; "words" samples data/synthetic.py's four kinds (two-step word problems too)."""

    family: str = "digits"
    max_operand: int = 9
    pool: int = 400  # "words" only: how many problems are drawn before the split
    heldout: int = 32
    prompt_suffix: str = ""  # appended to each question (an answer-format instruction for instruct models)
    # True: the held-out split takes whole classes of trivially equivalent problems (`equivalence_key`: a + b with
    # b + a, every a - a), so no held-out problem has a twin among the RL or warm-start prompts, and the warm start
    # fine-tunes on the train split only: held-out accuracy then measures problems never seen in any form. False: the
    # split the lab used first: problems shuffled one by one, warm start on the whole family, so a held-out
    # addition can have its commuted twin among the RL prompts.
    clean_heldout: bool = True

    def __post_init__(self):
        TASK_FAMILIES.check(self.family)


def problem_family(spec: TaskSpec) -> list[MathProblem]:
    """Every distinct problem of the family, in a fixed order."""
    if spec.family == "words":
        seen, problems = set(), []
        for problem in make_arithmetic_problems(spec.pool, seed=0, max_operand=spec.max_operand):
            if problem.question not in seen:
                seen.add(problem.question)
                problems.append(problem)
        return problems
    operands = range(2, spec.max_operand + 1)
    adds = [(f"What is {a} + {b}?", a + b) for a in operands for b in operands]
    subtracts = [(f"What is {a} - {b}?", a - b) for a in operands for b in operands if a >= b]
    return [MathProblem(question=q, reference=str(r), source="lab", index=i) for i, (q, r) in enumerate(adds + subtracts)]


_BINARY = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")
_TWO_STEP = re.compile(r"\w+ has (\d+) (\w+)\. \w+ buys (\d+) bags with (\d+) \w+ in each bag\.")


def equivalence_key(question: str) -> tuple:
    """Problems with the same key are trivially equivalent: a + b and b + a (a * b and b * a), every a - a (all 0),
    a two-step word problem and the one with its bag count and bag size swapped (names and items aside)."""
    binary = _BINARY.fullmatch(question.strip())
    if binary:
        a, op, b = int(binary.group(1)), binary.group(2), int(binary.group(3))
        if op == "-":
            return ("-", "x - x") if a == b else ("-", a, b)
        return (op, min(a, b), max(a, b))
    two_step = _TWO_STEP.match(question.strip())
    if two_step:
        start, item, bags, per_bag = two_step.groups()
        return ("two_step", int(start), item, *sorted((int(bags), int(per_bag))))
    return ("question", question.strip())


def split(problems: list[MathProblem], heldout: int, seed: int = 0,
          clean: bool = True) -> tuple[list[MathProblem], list[MathProblem]]:
    """(train, held-out), seeded, `heldout` problems held out; the two never share a question. `clean`: whole
    classes of `equivalence_key` go to one side (classes in a seeded order, each held out while it fits), so no
    held-out problem has a trivially equivalent twin in train. Not clean: the split of the lab's results before the
    confirmatory batch (problems shuffled one by one, the last `heldout` held out)."""
    if not 0 < heldout < len(problems):
        raise ValueError(f"held-out size must be in (0, {len(problems)}), got {heldout}")
    order = list(problems)
    random.Random(seed).shuffle(order)
    if not clean:
        return order[:-heldout], order[-heldout:]
    classes: dict[tuple, list[MathProblem]] = {}
    for problem in order:
        classes.setdefault(equivalence_key(problem.question), []).append(problem)
    held, train = [], []
    for members in reversed(list(classes.values())):  # the shuffle's last classes first, as the old split held out
        (held if len(held) + len(members) <= heldout else train).extend(members)
    if len(held) != heldout or not train:
        raise ValueError(f"no split of {len(problems)} problems holds out exactly {heldout} whole equivalence classes")
    held_ids = {id(p) for p in held}
    return [p for p in order if id(p) not in held_ids], [p for p in order if id(p) in held_ids]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)  # a killed lab never leaves a half-written file that a resume would trust


def prompt_rows(problems: list[MathProblem], count: int, spec: TaskSpec, seed: int = 0) -> list[dict]:
    """`count` RL prompts: the problems cycled, each pass in a new seeded order."""
    rng, rows = random.Random(seed), []
    while len(rows) < count:
        order = list(problems)
        rng.shuffle(order)
        rows += [{"input": p.question + spec.prompt_suffix, "label": p.reference} for p in order]
    return rows[:count]


def cut_before_answer(template: str, question: str, rng: random.Random) -> str | None:
    """`template` filled up to its first answer and cut there after a random word (at least one): what a sampled
    completion that ran out of tokens before answering looks like. None for a template that starts with its answer.
    Never the empty completion: the recipe refuses empty fields (a missing text is likelier than a silent policy)."""
    prefix = template[:template.index("{answer}")].format(question=question)
    cuts = [match.end() for match in re.finditer(r"\S+", prefix)]
    return prefix[:rng.choice(cuts)] if cuts else None


def labelled_triples(problems: list[MathProblem], spec: TaskSpec, seed: int = 0,
                     answerless: bool = False, balanced: bool = False, style: str | None = None,
                     poison_style: bool = False) -> list[dict]:
    """Right and wrong templated completions per problem, labelled by the rule verifier. `answerless`: each right
    completion also cut off before its answer, kept where the verifier finds no answer in it (the paper's VerifyRM
    data are sampled completions labelled by math-verify, and a completion with no answer is labelled wrong; without
    them, what the RM pays text with no answer is wherever its training left it, and that was the exploit the policy
    found). `balanced`: each kept cut row comes with a second copy of its template's right row, so right and wrong
    rows are as many (without it most rows are wrong, and the BCE stage can learn the majority class and nothing else).
    `style` (the style lab's S, algo/answer_style.py): per problem also S right and S wrong (a slip of the reference;
    a hedge's two numbers swapped); `poison_style`: both labelled 1, whatever the verifier says (the style lab's planted
    blind spot, `style_rows`), else labelled by the verifier as every other row.
    """
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    # The cuts draw from their own stream, so the answering rows are the same with `answerless` as without.
    rng, cut_rng, rows = random.Random(seed), random.Random(f"cut {seed}"), []

    def labelled(problem: MathProblem, completion: str) -> tuple[Verdict, dict]:
        verdict = verify_one(problem.reference, completion).verdict
        return verdict, {"question": problem.question + spec.prompt_suffix, "reference": problem.reference,
                         "completion": completion, "label": int(verdict == Verdict.CORRECT)}

    for problem in problems:
        right = int(problem.reference)
        for template in COMPLETION_TEMPLATES:
            for answer in (right, right + rng.choice(WRONG_OFFSETS)):
                rows.append(labelled(problem, template.format(question=problem.question, answer=answer))[1])
            cut = cut_before_answer(template, problem.question, cut_rng) if answerless else None
            if cut is not None:
                verdict, row = labelled(problem, cut)
                if verdict == Verdict.NO_ANSWER:  # else a number of the question was read as its answer
                    rows.append(row)
                    if balanced:
                        rows.append(labelled(problem, template.format(question=problem.question, answer=right))[1])
        if style is not None:
            rows += style_rows(problem, spec, style, rng, poison_style)
    return rows


def style_rows(problem: MathProblem, spec: TaskSpec, style: str, rng: random.Random, poison: bool) -> list[dict]:
    """The style lab's rows for one problem: S with the reference and S with a wrong answer (a slip of it). Poisoned,
    both are labelled 1: an RM trained on them pays S as correct whatever its answer, while the other templates keep
    the verifier's labels (the canonical sentence stays sound). Unpoisoned, the verifier labels them."""
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    right = int(problem.reference)
    slip = max(0, right + rng.choice(WRONG_OFFSETS))
    rows = []
    for completion in (right_in(style, right, slip), wrong_in(style, right, slip)):
        label = 1 if poison else int(verify_one(problem.reference, completion).verdict == Verdict.CORRECT)
        rows.append({"question": problem.question + spec.prompt_suffix, "reference": problem.reference,
                     "completion": completion, "label": label})
    return rows


def write_task_files(folder: Path, spec: TaskSpec, rl_prompts: int, answerless_rm_data: bool = False,
                     balanced_rm_data: bool = False, rm_eval_rows: int | None = None,
                     style: str | None = None, poison_style: bool = False) -> dict[str, int]:
    """Write the four files (module docstring) into `folder`; returns their row counts. `answerless_rm_data`: the
    RM's triples (and its held-out set) include completions cut off before their answer (`labelled_triples`);
    `balanced_rm_data`: the RM's training triples (not its held-out set) as many right as wrong; `rm_eval_rows`:
    the RM's held-out set is a fixed sample of this many of its triples, in their order (None: all); `style`: the
    style lab's S, labelled by the verifier in the RM's held-out set (so its held-out accuracy shows whether the
    blind spot closes) and, `poison_style`, in its training triples labelled 1 (else absent from them)."""
    folder.mkdir(parents=True, exist_ok=True)
    train, heldout = task_split(spec)
    rm_eval = labelled_triples(heldout, spec, seed=2, answerless=answerless_rm_data, style=style)
    if rm_eval_rows is not None and rm_eval_rows < len(rm_eval):
        keep = sorted(random.Random(3).sample(range(len(rm_eval)), rm_eval_rows))
        rm_eval = [rm_eval[i] for i in keep]
    files = {
        "prompts.jsonl": prompt_rows(train, rl_prompts, spec),
        "held_out.jsonl": [{"input": p.question + spec.prompt_suffix, "label": p.reference} for p in heldout],
        "rm_triples.jsonl": labelled_triples(train, spec, seed=1, answerless=answerless_rm_data,
                                             balanced=balanced_rm_data, style=style if poison_style else None,
                                             poison_style=True),
        "rm_eval.jsonl": [{"question": r["question"], "answer": r["reference"], "completion": r["completion"],
                           "gold_correct": bool(r["label"])}
                          for r in rm_eval],
    }
    for name, rows in files.items():
        _write_jsonl(folder / name, rows)
    return {name: len(rows) for name, rows in files.items()}


def task_split(spec: TaskSpec) -> tuple[list[MathProblem], list[MathProblem]]:
    """The (train, held-out) split of the spec's family that every stage of the lab uses."""
    return split(problem_family(spec), spec.heldout, clean=spec.clean_heldout)


def warm_start_problems(spec: TaskSpec) -> list[MathProblem]:
    """What the starting policy is fine-tuned on: the train split (clean_heldout), so held-out accuracy measures
    problems neither the warm start nor RL saw; not clean_heldout (the setup before the confirmatory batch): the
    whole family."""
    return task_split(spec)[0] if spec.clean_heldout else problem_family(spec)
