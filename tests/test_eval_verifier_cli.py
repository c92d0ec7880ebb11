"""eval_verifier CLI: reported metrics equal hand-computed ones; JSON output; bad rows; the rm path."""

import json

import pytest

from cooper_openrlhf.cli.eval_verifier import main
from cooper_openrlhf.models import model_path

# (answer, completion, gold_correct, answer_type) -> rule verdict in the comment
ROWS = [
    ("\\frac{1}{2}", "so \\boxed{0.5}", True, "fraction"),  # correct -> tp
    ("\\frac{1}{3}", "\\boxed{0.333}", True, "fraction"),  # incorrect (too few decimals) -> fn
    ("\\frac{2}{3}", "\\boxed{0.5}", False, "fraction"),  # incorrect -> tn
    ("18", "#### 18", True, "integer"),  # correct -> tp
    ("18", "The answer is 18.", False, "integer"),  # correct, but labelled wrong -> fp
    ("7", "I do not know", True, None),  # no answer -> fn
]


def write_verifybench(path, rows=ROWS, extra_lines=()):
    lines = [
        json.dumps({"question": f"q{i}", "answer": a, "completion": c, "gold_correct": g,
                    **({"answer_type": t} if t else {})})
        for i, (a, c, g, t) in enumerate(rows)
    ]
    path.write_text("\n".join([*lines, *extra_lines]) + "\n", encoding="utf-8")
    return path


def test_rule_metrics_equal_hand_computed(tmp_path, capsys):
    data = write_verifybench(tmp_path / "vb.jsonl", extra_lines=['{"question": "broken"'])
    out = tmp_path / "report.json"
    assert main(["--data", str(data), "--verifier", "rule", "--workers", "2", "--skip-invalid", "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    # overall: tp=2, fp=1, tn=1, fn=2
    assert report["overall"]["confusion"] == {"tp": 2, "fp": 1, "tn": 1, "fn": 2}
    assert report["overall"]["accuracy"] == pytest.approx(3 / 6)
    assert report["overall"]["precision"] == pytest.approx(2 / 3)
    assert report["overall"]["recall"] == pytest.approx(2 / 4)
    assert report["overall"]["f1"] == pytest.approx(2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2))
    by_type = report["by_answer_type"]
    assert by_type["fraction"]["confusion"] == {"tp": 1, "fp": 0, "tn": 1, "fn": 1}
    assert by_type["integer"]["confusion"] == {"tp": 1, "fp": 1, "tn": 0, "fn": 0}
    assert by_type["(none)"]["confusion"] == {"tp": 0, "fp": 0, "tn": 0, "fn": 1}
    assert report["details"]["verdict_counts"] == {"correct": 3, "incorrect": 2, "no_answer": 1}
    assert report["skipped"] == [{"line": 7, "reason": report["skipped"][0]["reason"]}]
    assert report["n"] == 6
    table = capsys.readouterr().out
    assert "skipped=1" in table
    assert "rule     all           6  0.5000  0.6667  0.5000  0.5714      2      1      1      2" in table
    assert "rule     integer       2  0.5000  0.5000  1.0000  0.6667      1      1      0      0" in table


def test_limit(tmp_path):
    data = write_verifybench(tmp_path / "vb.jsonl")
    out = tmp_path / "report.json"
    main(["--data", str(data), "--verifier", "rule", "--workers", "1", "--limit", "2", "--json-out", str(out)])
    assert json.loads(out.read_text())["overall"]["confusion"] == {"tp": 1, "fp": 0, "tn": 0, "fn": 1}


def test_bad_row_without_skip_fails_naming_line_and_field(tmp_path):
    data = write_verifybench(tmp_path / "vb.jsonl", extra_lines=[json.dumps({"question": "q", "answer": "1", "completion": "c"})])
    with pytest.raises(SystemExit, match=":7: field 'gold_correct' is missing"):
        main(["--data", str(data), "--verifier", "rule"])


def test_rm_and_judge_need_a_model(tmp_path):
    data = write_verifybench(tmp_path / "vb.jsonl")
    with pytest.raises(SystemExit, match="needs --model"):
        main(["--data", str(data), "--verifier", "rm"])


def tiny_rm_path() -> str:
    # A missing folder fails (naming the install step that makes it): install always materialises it.
    return model_path("tiny-qwen2-rm")


@pytest.mark.parametrize("threshold, predicted_all", [(0.0, True), (1.01, False)])
def test_rm_threshold_decides(tmp_path, threshold, predicted_all):
    data = write_verifybench(tmp_path / "vb.jsonl")
    out = tmp_path / "report.json"
    main(["--data", str(data), "--verifier", "rm", "--model", tiny_rm_path(), "--threshold", str(threshold),
          "--batch-size", "4", "--json-out", str(out)])
    confusion = json.loads(out.read_text())["overall"]["confusion"]
    # 4 rows are labelled correct, 2 wrong: all-positive gives tp=4, fp=2; all-negative fn=4, tn=2.
    assert confusion == ({"tp": 4, "fp": 2, "tn": 0, "fn": 0} if predicted_all else {"tp": 0, "fp": 0, "tn": 2, "fn": 4})


def test_rm_ranking_is_reported_whatever_the_threshold(tmp_path):
    """The rm verifier's `ranking` (AUC, mean reward of correct and wrong rows) is the RM's scores ranked against the
    gold labels: the same at every threshold, and what `ranking_metrics` gives on RMScorer's own scores."""
    from cooper_openrlhf.verify.metrics import ranking_metrics
    from cooper_openrlhf.rm.scorer import RMScorer

    data = write_verifybench(tmp_path / "vb.jsonl")
    reports = []
    for threshold in ("0.0", "1.01"):
        out = tmp_path / f"report{threshold}.json"
        main(["--data", str(data), "--verifier", "rm", "--model", tiny_rm_path(), "--threshold", threshold,
              "--batch-size", "4", "--json-out", str(out)])
        reports.append(json.loads(out.read_text())["details"]["ranking"])
    scores = RMScorer.load(tiny_rm_path(), batch_size=4).score([f"q{i}" for i in range(len(ROWS))], [r[0] for r in ROWS],
                                                         [r[1] for r in ROWS])
    expected = ranking_metrics(scores, [r[2] for r in ROWS], [f"q{i}" for i in range(len(ROWS))])
    assert reports[0] == reports[1]
    assert reports[0] == {key: value if isinstance(value, int) or value is None else round(value, 4)
                          for key, value in expected.to_dict().items()}


def test_rm_scores_do_not_depend_on_batching():
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from cooper_openrlhf.algo.template import render_rm_input
    from cooper_openrlhf.rm.scorer import RMScorer

    path = tiny_rm_path()
    questions = ["What is 2+2?", "q", "A much longer question " * 20]
    references, completions = ["4", "1", "\\frac{1}{2}"], ["\\boxed{4}", "no", "so the answer is 0.5 " * 30]
    batched = RMScorer.load(path, batch_size=3).score(questions, references, completions)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        one_by_one = [
            torch.sigmoid(model(**tokenizer(render_rm_input(q, r, c), return_tensors="pt")).logits[0, 0]).item()
            for q, r, c in zip(questions, references, completions)
        ]
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    assert all(0.0 < s < 1.0 for s in batched)
