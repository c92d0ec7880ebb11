"""Run reports: tensorboard event files and rollout logs of training runs -> PNG figures and markdown tables.

  runs.py       reading one run folder (identity, scalars, rollout logs)
  aggregate.py  pure: bands over seeds, per-arm summaries, stage times, alarm steps
  figures.py    matplotlib (Agg) figures
  markdown.py   report.md and summary.json
`cooper report RUN_DIR [RUN_DIR ...] --out DIR` composes them; docs/report.md says
how to read the result.
"""
