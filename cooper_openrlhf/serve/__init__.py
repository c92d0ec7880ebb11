"""The reward service: Cooper behind a trainer's reward URL (OpenRLHF's `--reward.remote_url`, TRL, verl).

protocol (requests in, responses out, prompt splitting), modes (the reward paid), batcher (across concurrent
requests), groups (GRPO groups pinned to an RM version), scorer (RM weights by version), learner (Cooper's RM update
on complete groups), service (the async core), checkpoint, metrics, app (HTTP: auth, limits). `cli.serve` wires them.
"""
