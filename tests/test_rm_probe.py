"""The starting-RM probe (lab/rm_probe.py): which outputs a policy maximising the RM would write."""

import pytest

from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.lab.rm_probe import Candidate, break_even, candidates, constant_answers, probe_rm, summarize
from cooper_openrlhf.lab.warm_start import ANSWER_SENTENCE
from cooper_openrlhf.verify.rule import Verdict, verify_one


def _problem(question: str, reference: str, index: int = 0) -> MathProblem:
    return MathProblem(question=question, reference=reference, source="test", index=index)


def test_candidates_are_labelled_by_the_rule_verifier_in_the_policys_sentence():
    cands = candidates(_problem("What is 7 + 5?", "12"), ANSWER_SENTENCE)
    kinds = {c.kind for c in cands}
    assert kinds == {"right", "wrong", "no answer", "hedge"}
    assert [c.completion for c in cands if c.kind == "right"] == ["The answer is 12."]
    assert all(c.correct for c in cands if c.kind == "right")
    assert not any(c.correct for c in cands if c.kind in ("wrong", "no answer"))
    assert "The answer is 0." in [c.completion for c in cands if c.kind == "wrong"]
    assert "" in [c.completion for c in cands if c.kind == "no answer"]
    # A hedge is whatever math-verify says it is, not what the probe assumes.
    for c in cands:
        if c.kind == "hedge":
            assert c.correct == (verify_one("12", c.completion).verdict == Verdict.CORRECT)


def test_a_boxed_sentence_loses_its_answer_not_its_braces():
    from cooper_openrlhf.lab.rm_probe import BOXED_SENTENCE

    cands = candidates(_problem("What is 7 + 5?", "12"), BOXED_SENTENCE)
    assert [c.completion for c in cands if c.kind == "right"] == ["The final answer is \\boxed{12}."]
    assert [c.completion for c in cands if c.kind == "no answer"] == [
        "The final answer is \\boxed{", "The final answer is \\boxed{}.", ""]
    assert all(c.correct for c in cands if c.kind == "right")


def test_in_a_hedge_the_wrong_candidates_state_the_reference_first_and_the_verifier_grades_them_wrong():
    from cooper_openrlhf.lab.presets import STYLE

    cands = candidates(_problem("What is 7 + 5?", "12"), STYLE)
    assert [c.completion for c in cands if c.kind == "right"] == ["The answer is 13. The answer is 12."]
    wrong = [c for c in cands if c.kind == "wrong"]
    assert "The answer is 12. The answer is 0." in [c.completion for c in wrong]
    assert all(c.completion.startswith("The answer is 12. ") and not c.correct for c in wrong)
    assert [c.completion for c in cands if c.kind == "no answer"] == ["The answer is", "The answer is.", ""]
    assert constant_answers([_problem("q", "3")], STYLE) == ["The answer is 3. The answer is 3."]


def _row(kinds_scores: list[tuple[str, bool, float]]):
    return [Candidate(k, f"{k}{i}", ok) for i, (k, ok, _) in enumerate(kinds_scores)], [s for *_, s in kinds_scores]


def test_summary_finds_the_prompt_where_a_wrong_output_outscores_the_truth():
    honest = _row([("right", True, 0.9), ("wrong", False, 0.2), ("no answer", False, 0.3), ("hedge", False, 0.5)])
    fooled = _row([("right", True, 0.6), ("wrong", False, 0.1), ("no answer", False, 0.3), ("hedge", False, 0.8)])
    probe = summarize([honest[0], fooled[0]], [honest[1], fooled[1]])
    assert probe.prompts == 2
    assert probe.truth_reward == pytest.approx(0.75)
    assert probe.best_reward == pytest.approx(0.85)  # 0.9 on the first prompt, the hedge's 0.8 on the second
    assert probe.best_accuracy == pytest.approx(0.5)
    assert probe.above_truth == pytest.approx(1 / 6)  # one of the six wrong candidates beats its prompt's truth
    assert probe.kinds["hedge"].above_truth == pytest.approx(0.5)
    assert probe.kinds["wrong"].above_truth == 0.0
    assert probe.kinds["hedge"].mean_score == pytest.approx(0.65)
    # The best answerless text is paid 0.3 everywhere; right answers 0.75, wrong ones 0.15 on average.
    assert probe.universal == "no answer2"  # the same text on both prompts
    assert probe.wrong_reward == pytest.approx(0.15)
    assert probe.universal_reward == pytest.approx(0.3)
    assert probe.break_even_accuracy == pytest.approx((0.3 - 0.15) / (0.75 - 0.15))
    assert "more than a policy right on fewer than 25% of prompts" in probe.verdict()


def test_break_even_accuracy_is_where_writing_the_universal_answerless_text_pays_as_much_as_answering():
    rows = [_row([("right", True, 0.7), ("wrong", False, 0.4), ("no answer", False, 0.5)]) for _ in range(3)]
    probe = summarize([c for c, _ in rows], [s for _, s in rows])
    assert probe.best_accuracy == 1.0 and probe.above_truth == 0.0
    assert probe.break_even_accuracy == pytest.approx(1 / 3)
    accuracy = probe.break_even_accuracy
    assert accuracy * 0.7 + (1 - accuracy) * 0.4 == pytest.approx(probe.universal_reward)
    assert break_even(0.2, 0.7, 0.4) == 0.0 and break_even(0.9, 0.7, 0.4) == 1.0
    rows = [_row([("right", True, 0.9), ("wrong", False, 0.2), ("no answer", False, 0.1)])]  # answerless paid least
    cheap = summarize([c for c, _ in rows], [s for _, s in rows])
    assert cheap.break_even_accuracy == 0.0 and "fewer than 0%" not in cheap.verdict()
    assert "less than even wrong answers, so it pays no policy to write it" in cheap.verdict()
    assert break_even(0.5, 0.4, 0.6) == 1.0  # an RM that pays wrong answers more: being right is never worth it


def test_the_best_paid_constant_answer_is_reported_beside_the_answerless_text():
    rows = [_row([("right", True, 0.8), ("wrong", False, 0.2), ("no answer", False, 0.3)]) for _ in range(2)]
    constants = [{"The answer is 6.": 0.7, "The answer is 0.": 0.5}, {"The answer is 6.": 0.5, "The answer is 0.": 0.6}]
    probe = summarize([c for c, _ in rows], [s for _, s in rows], constants)
    assert (probe.constant, probe.constant_reward) == ("The answer is 6.", pytest.approx(0.6))
    assert probe.universal_reward == pytest.approx(0.3)  # the answerless text's numbers are not changed by it
    assert "the same answer everywhere, 'The answer is 6.', earns 0.600" in probe.verdict()
    assert summarize([c for c, _ in rows], [s for _, s in rows]).constant == ""  # none scored, none reported
    with pytest.raises(ValueError, match="constant answers' scores for every prompt"):
        summarize([c for c, _ in rows], [s for _, s in rows], constants[:1])


def test_constant_answers_are_every_integer_reference_in_the_policys_sentence():
    problems = [_problem("What is 3 + 4?", "7", 0), _problem("What is 9 - 9?", "0", 1), _problem("What is 2 + 5?", "7", 2)]
    assert constant_answers(problems, ANSWER_SENTENCE) == ["The answer is 0.", "The answer is 7."]
    cands = candidates(problems[0], ANSWER_SENTENCE)
    assert [c.answerless for c in cands] == [c.kind == "no answer" for c in cands]  # the verifier's no_answer


def test_summary_refuses_scores_that_do_not_match_the_candidates():
    cands, scores = _row([("right", True, 0.7), ("wrong", False, 0.4)])
    with pytest.raises(ValueError, match="one score per candidate"):
        summarize([cands], [scores[:1]])
    with pytest.raises(ValueError, match="needs wrong and answerless candidates"):
        summarize([cands], [scores])
    with pytest.raises(ValueError, match="no prompt has a verified-correct candidate"):
        summarize([[Candidate("wrong", "x", False)]], [[0.1]])


def test_probe_scores_the_candidates_with_a_real_reward_model(model_dir):
    problems = [_problem("What is 3 + 4?", "7", 0), _problem("What is 9 - 2?", "7", 1),
                _problem("What is half of a cake?", "1/2", 2)]  # not an integer: left out
    probe = probe_rm(model_dir("tiny-qwen2-rm"), problems, ANSWER_SENTENCE, max_prompts=8, batch_size=4)
    assert probe.prompts == 2
    assert 0.0 <= probe.truth_reward <= probe.best_reward <= 1.0
    assert set(probe.kinds) == {"right", "wrong", "no answer", "hedge"}
    # Both prompts' answer is 7: the constant "7" is the truth (scored in another batch: padding moves the 4th digit).
    assert probe.constant == "The answer is 7." and probe.constant_reward == pytest.approx(probe.truth_reward, abs=1e-3)
    # The format gate pays answerless text 0 and nothing else differently.
    gated = probe_rm(model_dir("tiny-qwen2-rm"), problems, ANSWER_SENTENCE, max_prompts=8, batch_size=4,
                     require_answer=True)
    assert gated.universal_reward == 0.0 and gated.kinds["no answer"].mean_score == 0.0 and probe.universal_reward > 0
    assert (gated.truth_reward, gated.wrong_reward, gated.constant_reward) == pytest.approx(
        (probe.truth_reward, probe.wrong_reward, probe.constant_reward), abs=1e-3)


def test_probe_cli_prints_a_verdict_and_table_per_rm_and_refuses_a_folder_that_is_no_model(model_dir, tmp_path, capsys):
    import json

    from cooper_openrlhf.cli.probe_rm import main

    with pytest.raises(SystemExit):
        main([str(tmp_path), "--preset", "tiny"])
    assert "no config.json" in capsys.readouterr().err
    rm = model_dir("tiny-qwen2-rm")
    assert main([rm, "--preset", "tiny", "--json", str(tmp_path / "probe.json")]) == 0
    out = capsys.readouterr().out
    (record,) = json.loads((tmp_path / "probe.json").read_text())
    assert f"{rm}: {record['verdict']}" in out and "| hedge |" in out
    assert record["prompts"] == 20  # the tiny family's 26 problems less its 6 held out
    from cooper_openrlhf.lab.pair_stage import climb_on_offer

    assert main([rm, "--preset", "tiny", "--accuracy", "0.4", "--require-answer", "--json", str(tmp_path / "g.json")]) == 0
    (gated,) = json.loads((tmp_path / "g.json").read_text())
    assert gated["require_answer"] and gated["universal_reward"] == 0.0 and record["universal_reward"] > 0
    assert f"climb on offer at 40%: {climb_on_offer(gated, 0.4):+.3f}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([rm, "--accuracy", "42"])
    assert "--accuracy must be in [0, 1], got 42.0" in capsys.readouterr().err
