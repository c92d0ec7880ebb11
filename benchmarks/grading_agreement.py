"""How often the package's grading agrees with plain math-verify on cached `evaluate` generations.

    python benchmarks/grading_agreement.py runs/eval-smollm2/generations/*.jsonl

Package side: the rule verifier pool, as `cli.evaluate` grades (CORRECT vs anything else).
Plain side: math-verify as its README shows it, ``verify(parse(gold), parse(completion))`` with
the reference as gold, written ``\\boxed{reference}`` so that a bare reference parses (default
extraction configs, math-verify's own timeouts). Prints the agreement per file and overall, and
every disagreement with both sides' extracted answers, for a person to judge.
"""

import argparse
import sys

from cooper_openrlhf.eval.cache import read_generations
from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import Verdict


def plain_math_verify(reference: str, completion: str) -> tuple[bool, str]:
    """(verdict, the answer string math-verify parsed from the completion)."""
    from math_verify import parse, verify

    predicted = parse(completion)
    return bool(verify(parse(f"\\boxed{{{reference}}}"), predicted)), (str(predicted[-1]) if predicted else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("caches", nargs="+", help="generations/<benchmark>.jsonl files written by cli.evaluate")
    parser.add_argument("--show", type=int, default=50, help="print at most this many disagreements")
    args = parser.parse_args()

    total = agree = 0
    disagreements = []
    with VerifierPool(deadline_s=10.0) as pool:
        for path in args.caches:
            _, rows = read_generations(path)
            items = [(row, s, text) for row in rows for s, text in enumerate(row["completions"])]
            result = pool.verify_batch([row["reference"] for row, _, _ in items], [text for _, _, text in items])
            file_agree = 0
            for (row, sample, text), outcome in zip(items, result.outcomes):
                plain, plain_answer = plain_math_verify(row["reference"], text)
                ours = outcome.verdict == Verdict.CORRECT
                if ours == plain:
                    file_agree += 1
                else:
                    disagreements.append((path, row["index"], sample, row["reference"], outcome.verdict.value,
                                          outcome.extracted, plain, plain_answer, text[-300:]))
            print(f"{path}: {file_agree}/{len(items)} agree ({100 * file_agree / max(len(items), 1):.2f}%)")
            total += len(items)
            agree += file_agree
    print(f"\noverall: {agree}/{total} agree ({100 * agree / max(total, 1):.2f}%), {len(disagreements)} disagreements")
    for path, index, sample, reference, verdict, extracted, plain, plain_answer, tail in disagreements[: args.show]:
        print(f"\n--- {path} question {index} sample {sample}: reference {reference!r}")
        print(f"package: {verdict} (extracted {extracted!r}); plain math-verify: {plain} (parsed {plain_answer!r})")
        print(f"completion tail: {tail!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
