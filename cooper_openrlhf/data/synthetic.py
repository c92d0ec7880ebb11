"""Deterministic synthetic arithmetic problems with integer answers, for CPU demo runs and tests.

Kinds (picked round-robin so every kind appears in any 4 consecutive problems):
  add       "What is 37 + 48?"
  subtract  "What is 85 - 29?"            (never negative)
  multiply  "What is 7 * 12?"
  two_step  "Mia has 12 apples. She buys 3 bags with 4 apples in each bag. How many apples does she have now?"
The same (n, seed, max_operand) always gives the same problems, in the same order.
"""

import random

from cooper_openrlhf.data.records import MathProblem

KINDS = ("add", "subtract", "multiply", "two_step")
_NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Ines", "Kai")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps")


def _one_problem(rng: random.Random, kind: str, max_operand: int) -> tuple[str, int]:
    a, b = rng.randint(2, max_operand), rng.randint(2, max_operand)
    if kind == "add":
        return f"What is {a} + {b}?", a + b
    if kind == "subtract":
        big, small = max(a, b), min(a, b)
        return f"What is {big} - {small}?", big - small
    if kind == "multiply":
        small_a, small_b = rng.randint(2, 12), rng.randint(2, 12)
        return f"What is {small_a} * {small_b}?", small_a * small_b
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    bags, per_bag = rng.randint(2, 6), rng.randint(2, 9)
    question = (
        f"{name} has {a} {item}. {name} buys {bags} bags with {per_bag} {item} in each bag. "
        f"How many {item} does {name} have now?"
    )
    return question, a + bags * per_bag


def make_arithmetic_problems(n: int, seed: int = 0, max_operand: int = 99) -> list[MathProblem]:
    """`n` problems from a generator seeded with `seed`; operands in [2, max_operand]."""
    if n < 0 or max_operand < 2:
        raise ValueError(f"need n >= 0 and max_operand >= 2, got n={n}, max_operand={max_operand}")
    rng = random.Random(seed)
    problems = []
    for index in range(n):
        question, answer = _one_problem(rng, KINDS[index % len(KINDS)], max_operand)
        problems.append(MathProblem(question=question, reference=str(answer), source="synthetic", index=index))
    return problems
