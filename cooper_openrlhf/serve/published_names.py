"""The reward service's published names that still say "round", its old word for what the code calls a step.

A step is `groups_per_update` complete groups and one RM update: one synchronous trainer step (`core/__init__.py`:
one word for one thing). Clients, dashboards and scripts already parse the names below (fields of /metrics and
/health, the steps' log, command-line flags, the counters a checkpoint holds), so they keep the old word; the code
writes and reads them only through these constants, and tests/test_published_names.py pins their values and fails
on the word anywhere else in `serve/`.
"""

# /metrics (`cooper_serve{name=...}`) and /health fields
STEPS_COUNTER = "rounds"  # steps run; also a key of the counters a checkpoint holds
STEP_FAILURES = "round_failures"  # steps (or expiry passes) that raised
STEPS_DROPPED = "rounds_dropped"  # replicated: steps that killed the learner MAX_STEP_KILLS times
# a trainer-group warning kind; at /metrics and /health as `group_warnings_open_at_a_rounds_end`
OPEN_AT_STEP_END = "open at a round's end"

# /metrics: the Prometheus gauge of the last step's metrics, one label per metric key
STEP_METRICS_GAUGE = "cooper_serve_round"

# the steps' log (`{out}/metrics.jsonl`): the key of a line's step index
STEP_LOG_KEY = "round"

# how /health's "learning" names a failed step ("failing: round 7: OSError: ...") and the log says it failed
FAILED_STEP = "round {index}"

# `cooper serve` flags (their dest is the step name: `serve.build` and the CLI read `args.<step name>`)
PARTIAL_STEP_AFTER_S_FLAG = "--partial-round-after-s"
RM_UPDATES_PER_STEP_FLAG = "--rm-updates-per-round"
RM_SCHEDULE_STEPS_FLAG = "--rm-schedule-rounds"
