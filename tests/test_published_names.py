"""The reward service's published names that still say "round" (serve/published_names.py) stay as clients read them,
and nowhere else in `serve/` does the code say "round": inside, it is a step.

The names are asserted as literals, read from what the service writes (its /metrics and /health numbers, the steps'
log, the CLI's flags), so a rename of a constant or of the code around it fails here."""

import asyncio
import json
import re
from pathlib import Path

from test_serve_registry_start import _Learner as _RegistryLearner
from test_serve_steps import _Learner, _Scorer, run_steps

import cooper_openrlhf.serve as serve_package
from cooper_openrlhf.serve import published_names
from cooper_openrlhf.serve.metrics import ServiceLog
from cooper_openrlhf.serve.replicated.registry import GroupRegistry
from cooper_openrlhf.serve.service import RewardService, ServiceConfig

SERVE_DIR = Path(serve_package.__file__).parent
# "round" as a word or a part of a name, not inside a longer word ("around", "background", "rounding")
ROUND_WORD = re.compile(r"(?<![a-z])rounds?(?![a-z])", re.IGNORECASE)
BUILTIN_ROUND = re.compile(r"(?<![\w.])round\(")


def says_round(line: str) -> bool:
    """Whether `line` says "round" other than by calling the builtin `round(...)`."""
    return bool(ROUND_WORD.search(BUILTIN_ROUND.sub("(", line)))


def test_the_published_names_keep_their_old_word():
    assert published_names.STEPS_COUNTER == "rounds"
    assert published_names.STEP_FAILURES == "round_failures"
    assert published_names.STEPS_DROPPED == "rounds_dropped"
    assert published_names.OPEN_AT_STEP_END == "open at a round's end"
    assert published_names.STEP_METRICS_GAUGE == "cooper_serve_round"
    assert published_names.STEP_LOG_KEY == "round"
    assert published_names.FAILED_STEP.format(index=7) == "round 7"
    assert (published_names.PARTIAL_STEP_AFTER_S_FLAG, published_names.RM_UPDATES_PER_STEP_FLAG,
            published_names.RM_SCHEDULE_STEPS_FLAG) == ("--partial-round-after-s", "--rm-updates-per-round",
                                                        "--rm-schedule-rounds")


def test_metrics_health_and_the_steps_log_show_the_published_names(tmp_path):
    """One step that fails and one that succeeds, as tests/test_serve_steps.py runs them."""
    log = ServiceLog(str(tmp_path), tensorboard=False)
    service = RewardService(ServiceConfig(group_size=2, groups_per_update=1), _Scorer(), [lambda r, c: []], log,
                            learner=_Learner(failures=1))
    (first, _), (second, gauges) = run_steps(service, ("p0", "p1"))
    learning = [first, second]
    assert learning[0].startswith("failing: round 0: OSError") and learning[1] == "ok"
    assert gauges["rounds"] == 2.0 and gauges["round_failures"] == 1.0
    assert "group_warnings_open_at_a_rounds_end" in gauges
    text = log.exposition(gauges).decode()
    assert 'cooper_serve{name="rounds"} 2.0' in text and 'cooper_serve{name="round_failures"} 1.0' in text
    assert 'cooper_serve_round{key="cooper_rm_updated"} 1.0' in text  # the last step's metrics
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in logged] == [0, 1]


def test_the_replicated_registry_shows_the_published_names():
    registry = GroupRegistry(ServiceConfig(group_size=4, groups_per_update=2), learner=_RegistryLearner())
    gauges = asyncio.run(registry.status())["gauges"]
    assert gauges["rounds"] == 5.0  # the learner's counter, under the name a checkpoint holds it by
    assert gauges["round_failures"] == 0.0 and gauges["rounds_dropped"] == 0.0


def test_the_cli_keeps_its_flags_and_reads_them_as_steps():
    from cooper_openrlhf.cli.serve import build_parser

    args = build_parser().parse_args(["--rm", "RM", "--partial-round-after-s", "7", "--rm-updates-per-round", "2",
                                      "--rm-schedule-rounds", "9"])
    assert (args.partial_step_after_s, args.rm_updates_per_step, args.rm_schedule_steps) == (7.0, 2, 9)


def test_serve_says_round_only_in_its_published_names():
    found = [f"{path.relative_to(SERVE_DIR)}:{number}: {line.strip()}"
             for path in sorted(SERVE_DIR.rglob("*.py")) if path.name != "published_names.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if says_round(line)]
    assert not found, "serve/ calls a step a round outside serve/published_names.py:\n" + "\n".join(found)


def test_the_round_pattern_tells_the_word_from_longer_words():
    assert all(says_round(text) for text in ("a round", "Rounds are", "self._run_round(", "cooper_serve_round",
                                             "rounds_dropped", "MAX_ROUND_KILLS", "x.round(2)"))
    assert not any(says_round(text) for text in ("around", "in the background", "rounding", "y = round(x, 2)"))
