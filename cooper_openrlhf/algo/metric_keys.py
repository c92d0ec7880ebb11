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
