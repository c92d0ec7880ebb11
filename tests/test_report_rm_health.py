"""The report's RM health figure (report/rm_health.py): drawn from the runs that logged cooper/rm_health/*, absent
otherwise, and part of every report built from such runs."""

from cooper_openrlhf.report.rm_health import AUC, FIGURE, RIGHT, UNHEALTHY, WRONG, write_rm_health
from cooper_openrlhf.report.runs import RunData


def _run(arm: str, seed: int, collapse: bool) -> RunData:
    steps = range(1, 11)
    wrong = [(s, 0.1 + (0.08 * s if collapse else 0.0)) for s in steps]
    return RunData(f"/runs/{arm}_{seed}", arm, seed, {
        AUC: [(s, 0.95 - (0.045 * s if collapse else 0.0)) for s in steps], RIGHT: [(s, 0.9) for s in steps],
        WRONG: wrong, UNHEALTHY: [(s, float(not collapse and s == 4)) for s in steps]})


def test_the_figure_is_drawn_for_runs_with_rm_health_and_left_out_without(tmp_path):
    runs = [_run("cooper_unguarded", seed, True) for seed in range(2)] + [_run("cooper", 0, False),
                                                                           RunData("/runs/rule_0", "rule", 0, {})]
    path = write_rm_health(runs, tmp_path)
    assert path == tmp_path / FIGURE and path.stat().st_size > 10_000
    assert write_rm_health([RunData("/runs/rule_0", "rule", 0, {})], tmp_path / "none") is None
