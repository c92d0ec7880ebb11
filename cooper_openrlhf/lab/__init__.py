"""The reward-hacking lab (`cooper lab`): the paper's arms on one machine, several seeds.

  task        the problem family, its RL / held-out split, and the files every arm reads
  warm_start  the starting policy: the tiny Qwen2 fine-tuned into RL's useful accuracy band
  presets     sizes (tiny / quick / full / smollm2) and the arms' reward paths
  prepare     the shared starting point: task files, policy, starting VerifyRM and its probe
  rm_probe    what a policy maximising an RM would write (right, wrong, answerless, hedged, constant answers)
  runner      one arm x seed as a real `train_cooper` run, resumable, failures recorded
See docs/lab.md for the setup and the reason for each choice.
"""
