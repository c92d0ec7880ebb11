"""The blind-spot sweep's reading of lab folders (lab/blindspot.py): which folders it compares, and its table."""

import json
from dataclasses import asdict

import pytest

from cooper_openrlhf.cli import blindspot as blindspot_cli
from cooper_openrlhf.lab.blindspot import LabPoint, incompatible_settings, markdown_table, rule_band, sweep
from cooper_openrlhf.lab.presets import PRESETS


def _lab(folder, *, truth=0.8, wrong=0.3, universal=0.7, accuracy=0.4, finals=None, committed=False, **settings):
    """A lab folder as cli.lab leaves it (lab.json, report/summary.json), or as docs/results keeps it."""
    folder.mkdir(parents=True)
    preset = asdict(PRESETS["full"].with_overrides(**settings))
    record = {"setup": {"policy": {"train_accuracy": accuracy},
                        "rm_probe": {"truth_reward": truth, "wrong_reward": wrong, "universal_reward": universal}},
              "preset_settings": preset}
    (folder / "lab.json").write_text(json.dumps(record))
    summary_dir = folder if committed else folder / "report"
    summary_dir.mkdir(exist_ok=True)
    arms = [{"arm": arm, "final_values": values} for arm, values in (finals or {}).items()]
    (summary_dir / "summary.json").write_text(json.dumps({"arms": arms}))
    return folder


def test_each_arm_sits_at_its_starting_rms_climb_with_its_seeds_finals(tmp_path):
    blind = _lab(tmp_path / "blind", universal=0.7, finals={"static": [0.0, 0.2], "rule": [0.4, 0.5]},
                 rm_pair_candidate=7)
    sharp = _lab(tmp_path / "sharp", universal=0.3, finals={"static": [0.4], "cooper": [0.3, 0.5]}, committed=True,
                 starting_rm="/some/rm", rm_pair_steps=0)
    points = sweep([blind, sharp])
    # climb = universal - (0.4 * 0.8 + 0.6 * 0.3) = universal - 0.5
    assert [(p.arm, round(p.climb, 6), p.finals) for p in points] == [
        ("cooper", -0.2, (0.3, 0.5)), ("static", -0.2, (0.4,)), ("rule", 0.2, (0.4, 0.5)), ("static", 0.2, (0.0, 0.2))]
    assert rule_band(points).finals == (0.4, 0.5)
    table = markdown_table(points)
    assert "| lab (starting RM) | climb on offer | cooper | static |" in table
    assert f"| {sharp} | -0.200 | 0.400 ± 0.141 (0.30, 0.50) | 0.400 ± 0.000 (0.40) |" in table
    assert f"| {blind} | +0.200 | - | 0.100 ± 0.141 (0.00, 0.20) |" in table
    assert "every folder's seeds pooled: 0.450 ± 0.071 (2 runs)" in table


def test_folders_that_differ_in_more_than_their_starting_rm_are_not_compared(tmp_path):
    slow = _lab(tmp_path / "slow", finals={"static": [0.1]})
    fast = _lab(tmp_path / "fast", finals={"static": [0.1]}, actor_lr=3e-4, steps=40, seeds=6)
    with pytest.raises(ValueError, match=r"differ in more than their starting RM: actor_lr, steps \("):
        sweep([slow, fast])
    assert incompatible_settings([{"preset_settings": {"seeds": 3, "rm_pair_candidate": 1}},
                                  {"preset_settings": {"seeds": 6}}]) == []  # what a sweep varies


def test_a_folder_without_a_lab_record_fails_naming_the_file(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert blindspot_cli.main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert f"{tmp_path / 'empty' / 'lab.json'}: no lab record" in capsys.readouterr().err


def test_a_point_of_one_seed_has_no_spread():
    assert LabPoint("lab", "static", 0.1, (0.3,)).std == 0.0
