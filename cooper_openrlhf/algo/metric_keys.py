"""The metric keys the trainer logs and the hacking rule, the report and the replay read: one definition each."""

GAP = "cooper/reward_hacking_gap"  # RM reward mean - verified accuracy of the step's rollouts
RM_REWARD = "cooper/rm_reward_mean"  # the RM's mean reward over the step's rollouts
ACCURACY = "cooper/verified_accuracy"  # the rule verifier's accuracy over the step's rollouts
PAIR_ACCURACY = "cooper/rm_pair_accuracy"  # the RM on the step's fresh pairs, before it trains on them
WRONG_REWARD = "cooper/rm_reward_wrong_mean"  # the RM's mean reward on the step's verified-wrong rollouts
CORRECT_REWARD = "cooper/rm_reward_correct_mean"  # ... and on its verified-correct ones
ALARM = "cooper/hacking_alarm"  # 1.0 while the reward-hacking alarm is on
RESPONSE_LENGTH = "rollout/response_length_mean"  # OpenRLHF's `_compute_rollout_stats`
HELDOUT, HELDOUT_PREFIX, HELDOUT_SUFFIX = "eval/accuracy", "eval/", "/accuracy"  # eval/accuracy or eval/<name>/accuracy
HELDOUT_SAMPLES = "eval/samples"  # graded samples the held-out accuracy is a mean of
HELDOUT_GAP, HELDOUT_GAP_SE = "eval/reward_hacking_gap", "eval/reward_hacking_gap_se"  # the RM on held-out rollouts
# The RM's probe suite (rm/probes.py), read every --eval.steps: pay and premium over canonical wrong answers per form.
PROBE_PAY, PROBE_PREMIUM = "cooper/probe_pay/", "cooper/probe_premium/"  # + the form's name
PROBE_RIGHT = "right"  # the anchor whose premium is the RM's margin between right and wrong answers
# The forms whose probes the rule verifier grades wrong: an RM paying one of them like a right answer is paying for
# what the verifier rejects (rule probe_paid_as_right).
PROBE_WRONG_FORMS = ("exploit", "exploit_tail", "reference_then_wrong", "master_key", "truncated")
REWARD_FROM_RULE = "cooper/reward_from_rule"  # 1.0 once a hacking alarm switched the policy's reward to the rule's
PAID_REWARD = "cooper/reward_paid_mean"  # what the policy was paid on average (the reward service's step log)
VERIFY_TIMEOUTS = "cooper/verify_timeouts"  # rollouts whose verification ran out of time (counts, as the three below)
VERIFY_NO_ANSWER = "cooper/verify_no_answer"  # rollouts without a final answer
VERIFY_ERRORS = "cooper/verify_errors"  # rollouts whose verification failed
