"""The reward service past one process, on Ray Serve (`cli.serve --replicas N`).

The same service as `serve/service.py`, cut where a process boundary does the least harm:
- `ingress.py`: the HTTP face. Ray Serve's proxy hands each request to an ingress replica running today's app
  (`serve/app.py`: auth, parsing, validation, prompt splitting, limits, the answer) around `RemoteService`,
  which asks the registry for the sample's group place, has a scoring replica score it, and retries a scoring
  call whose replica died until the request's own timeout: a restart costs the trainer time, never a failed try.
- `scoring.py`: N scoring replicas, each the RM (`rm/scorer.py`, by version) and a rule-verifier pool, batched by
  Serve's own `@serve.batch`; a replica fetches a version's weights from the object store the first time it
  meets it.
- `registry.py`: one actor holding the GRPO groups (`serve/groups.py`'s `GroupTracker`, the trainer-group checks
  of `serve/trainer_groups.py`, the wait-for-update gate), so the samples of one group are scored by one version
  whichever replica scores them. It hands each complete step to the learner. Ray restarts it when it dies, and
  the callers send their calls again meanwhile (`retry.py`).
- `learner_actor.py`: one actor running the steps (`serve/learner.py`: the core's pairs and
  `rm/pairwise_update.py`), the hacking monitor, the steps' log and the checkpoints (`serve/checkpoint.py`, the
  one-process format); each new version is returned once, as an object the registry owns.
- `launch.py`: starts Ray (or joins `--ray-address`), the actors, Serve's proxy and the deployments.

Without `--replicas` none of this is imported: one process, as before.
"""
