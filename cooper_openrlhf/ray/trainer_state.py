"""What the parts of the Cooper trainer share: the attributes `CooperPPOTrainer.init_cooper` sets (and the ones of
OpenRLHF's PPOTrainer they read), declared once. The parts are mixins of `ray/trainer.CooperPPOTrainer` because
OpenRLHF's fit loop calls their methods on the trainer itself (`evaluate`, `save_logs_and_checkpoints`,
`init_checkpoint_states`, `save_best_checkpoint`); each part subclasses this declaration instead of listing its
needs in prose, so a type checker and a reader see one list.

Also the two places the trainer reaches into OpenRLHF's and Ray's private attributes, where neither offers a public
way (`rank_actors`, `undecorated`).
"""

from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor

from cooper_openrlhf.core import HackingResponse, PairConfig, PayConfig


class CooperTrainerState:
    """The trainer's shared attributes (set by `init_cooper`, or by OpenRLHF's PPOTrainer where noted)."""

    # Cooper's, set by init_cooper
    cooper: Namespace  # the --cooper.* flags
    rm_group: object | None  # the TrainableRewardModelActor RayActorGroup (None: the rule arm without an RM)
    pair_actor: object  # the PairConstructionActor handle (verifier pool + assistant)
    rm_trainable: bool  # --remote_rm_trainable
    pay: PayConfig  # what the policy is paid (core.pay)
    pair_config: PairConfig  # how the step's pairs are made (core.step_pairs)
    hacking: HackingResponse  # the hacking rule's state and the response it took (core.hacking_response)
    questions: dict[str, str]  # OpenRLHF's rendered prompt -> raw question
    beside: ThreadPoolExecutor  # the trainer's second thread (rewrites, pairs, the overlapped RM update)
    sample_log_dir: str | None  # --cooper.sample_log_dir
    latest_eval: dict  # the last held-out evaluation's logs, not yet seen by the hacking response
    rm_eval_rows: list  # --cooper.rm_eval_dataset's VerifyBench rows
    probes: list  # the RM's probe suite (rm/probes.py), built by init_probes
    probes_dropped: dict
    # OpenRLHF's PPOTrainer's
    args: Namespace  # the hierarchized flags
    strategy: object
    tokenizer: object
    vllm_engines: list
    actor_model_group: object
    samples_generator: object
    eval_dataloader: object
    wandb_logger: object | None
    tensorboard_logger: object | None
    best_eval_metric_key: str
    best_eval_metric_value: float


def rank_actors(group) -> list:
    """A RayActorGroup's rank actors, in rank order. OpenRLHF 0.11.2's RayActorGroup fans a call out to all ranks
    (`async_run_method`) but has no public way to address one rank, which the RM's scoring (each rank its own slice
    of the texts) and its update (each rank its share of the pairs) need; it keeps them in `_actor_handlers`."""
    return group._actor_handlers


def undecorated(actor_class):
    """The class a `@ray.remote` decorator wrapped. OpenRLHF 0.11.2 publishes PPOTrainer only decorated, and Ray's
    ActorClass cannot be subclassed nor offers a public way back to its class; Ray keeps it in
    `__ray_metadata__.modified_class`."""
    return actor_class.__ray_metadata__.modified_class
