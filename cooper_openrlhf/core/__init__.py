"""The Cooper core: one Cooper step's logic on plain data, called by both transports.

A step's rollouts go in (`Rollouts`: texts, prompts' questions and labels, the rule verifier's verdicts, the RM's
logits) and out come the rewards in the configured form (`rewards`), the pairs the RM trains on (`plan_pairs` ->
the assistant's rewrites -> `finish_pairs`, or `build_pairs` serially), the step's metrics under one set of keys
(`algo.metric_keys`), the hacking response (`HackingResponse`) and the RM's health with the guard that decides whether
a version may score (`core.rm_health`: `health_of`, `RMGuard`). The trainer (`ray/trainer.py`, Ray actors) and
the reward service (`serve/`, HTTP) are transports around it: neither selects a pair or shapes a reward itself
(tests/test_core_transports.py).

One word for one thing: a *step*. The paper's Algorithm 1, OpenRLHF's `global_step`, the trainer's logs and
checkpoints (`global_stepN`) and the hacking rule's window all count steps, and the reward service's groups are
set up so that one synchronous trainer step is one update of the RM. The service's published names (/metrics and
/health fields, its log's key, three flags) keep their old word for the clients and dashboards that read them, all
in `serve/published_names.py`; inside the core and the service it is a step.

Knows nothing of Ray, HTTP or DeepSpeed engines: built on `algo/`, `verify/` and `rm/` (the layer test places it
above them and below `ray/` and `serve/`).
"""

from cooper_openrlhf.core.hacking_response import HackingResponse
from cooper_openrlhf.core.pay import REWARD_MODES, PayConfig, Rewards, rewards, rm_pay
from cooper_openrlhf.core.rm_health import GuardConfig, GuardDecision, RMGuard, RMHealth, health_metrics, health_of
from cooper_openrlhf.core.rollouts import Rollouts, RolloutTexts, RolloutVerdicts
from cooper_openrlhf.core.step_pairs import PairConfig, build_pairs, finish_pairs, plan_pairs

__all__ = ["GuardConfig", "GuardDecision", "HackingResponse", "PairConfig", "PayConfig", "REWARD_MODES", "RMGuard",
           "RMHealth", "Rewards", "RolloutTexts", "RolloutVerdicts", "Rollouts", "build_pairs", "finish_pairs",
           "health_metrics", "health_of", "plan_pairs", "rewards", "rm_pay"]
