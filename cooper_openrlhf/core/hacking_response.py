"""The hacking response: the reward-hacking rule watched every step, and what an alarm switches.

Each step's metrics (and the latest held-out evaluation's, if any) go to `algo.hacking`'s rule (`guard_step`); when
the alarm turns on the response named by on_hacking (`algo.hacking.ALARM_RESPONSES`) is taken once: rule_reward
pays the policy by the rule verifier from the next step on (`paying_rule`, read by `core.pay.rewards`), stop
asks the transport to checkpoint and end the run (`stop`; the reward service offers no stop, it has no run to end).
"""

import logging
from collections.abc import Mapping

from cooper_openrlhf.algo.hacking import ALARM_RESPONSES, HackingMonitor, HackingMonitorConfig, guard_step
from cooper_openrlhf.algo.metric_keys import ALARM, REWARD_FROM_RULE

logger = logging.getLogger(__name__)


class HackingResponse:
    """The rule's state over a run and the response it has taken; see the module docstring."""

    def __init__(self, monitor: HackingMonitorConfig, on_hacking: str, paying_rule: bool = False):
        self.monitor = HackingMonitor(monitor)
        self.on_hacking = on_hacking
        self.response = ALARM_RESPONSES[on_hacking]
        self.paying_rule = paying_rule  # rule_reward was taken (a restart passes what its checkpoint recorded)
        self.stop = False  # stop was asked for

    def watch(self, step: int, metrics: Mapping[str, float],
              heldout: Mapping[str, float] | None = None) -> dict[str, float]:
        """Feed step `step`'s metrics (and a held-out evaluation made since the last call) to the rule; take the
        response when the alarm turns on. Returns the `cooper/hacking_*` metrics and REWARD_FROM_RULE to log."""
        was_on = self.monitor.alarm_on
        logged = guard_step(self.monitor, step, metrics, heldout)  # logs the reasons when it turns on
        if logged[ALARM] and not was_on:
            self.stop |= self.response.checkpoint_and_stop
            if self.response.reward_from_rule and not self.paying_rule:
                self.paying_rule = True
                logger.warning("on_hacking rule_reward: the policy's reward is the rule verifier's from step %d on "
                               "(the RM is still scored, logged and, where it learns, trained)", step + 1)
        logged[REWARD_FROM_RULE] = float(self.paying_rule)
        return logged
