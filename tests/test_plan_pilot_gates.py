"""scripts/plan_pilot_gates.py reads the pilot's runs only: the probe lab's folder also holds the Cooper arms and the
control, whose primaries must stay unread until every run is done (docs/lab/batch46/plan.json)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "plan_pilot_gates.py"


def _reader():
    spec = importlib.util.spec_from_file_location("plan_pilot_gates", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pilot_reader_reads_rule_static_and_oracle_seeds_0_and_1_and_nothing_else(tmp_path):
    for arm in ("rule", "static", "oracle", "cooper", "offline_pairs", "cooper_rollout"):
        for seed in range(3):
            run = tmp_path / "runs" / f"{arm}_seed{seed}"
            run.mkdir(parents=True)
            (run / "run_info.json").write_text(json.dumps({"arm": arm, "seed": seed, "status": "done"}))
    assert sorted(_reader().finished(tmp_path)) == [(arm, seed) for arm in ("oracle", "rule", "static")
                                                    for seed in (0, 1)]
