"""The reward service: Cooper behind a trainer's reward URL (OpenRLHF's `--reward.remote_url`, TRL, verl).

A transport around the Cooper core (`core/`: the reward paid, the pairs, the metrics, the hacking response):
protocol (requests in, responses out, prompt splitting), batcher (across concurrent requests), groups (GRPO groups
pinned to an RM version; the versions themselves are `rm/scorer.py`'s), learner (Cooper's RM update on complete groups), service (the async loop), checkpoint,
metrics, app (HTTP: auth, limits). `build` wires them from `cooper serve`'s flags (`cli/serve.py`). Inside, the
service's unit of learning is a step, as the trainer's; the names clients read that still say otherwise are all in
`published_names.py`.
"""
