"""A checkpoint on request: a file `{ckpt.path}/save_request` asks the trainer to save the step in flight.

Slurm warns a job SIGNAL_MARGIN before its time limit (`--signal=B:USR1@600`). Requeued without a save at that
moment, the next attempt does again every step since the last --ckpt.save_steps checkpoint: up to 19 steps at the
default of 20, the largest cost of a requeue. So the RL launcher's USR1 handler (`launch_scripts/common.sh`,
`request_checkpoint`) writes the request; at the end of the step in flight the trainer saves the policy and the
RM as one unit (`ray/checkpoints.py`) and answers in `save_request.done` with the tag it saved; the handler
requeues once answered, or once its wait is over. A user can ask the same by hand: `echo why > CKPT/save_request`.

A file rather than a signal: the trainer is a Ray actor, perhaps on another node than the batch shell, and the
checkpoint folder is already shared by every attempt of the run. Pure file handling, no Ray.
"""

import os

REQUEST = "save_request"  # written by whoever asks; its text is the reason, for the log
ANSWER = "save_request.done"  # written by the trainer: the tag it saved


def pending_request(ckpt_path: str) -> str | None:
    """The reason of a pending request (empty text: no reason given), or None when none is pending."""
    try:
        with open(os.path.join(ckpt_path, REQUEST), encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return None


def answer_request(ckpt_path: str, tag: str) -> None:
    """The request was met by the checkpoint `tag`: the answer first (written beside and renamed over, so a reader
    never sees half a tag), then the request goes."""
    path = os.path.join(ckpt_path, ANSWER)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(tag + "\n")
    os.replace(path + ".tmp", path)
    try:
        os.remove(os.path.join(ckpt_path, REQUEST))
    except FileNotFoundError:
        pass


def clear_requests(ckpt_path: str) -> list[str]:
    """At a run's start: a request or an answer left by an earlier attempt is stale (that attempt ended before its
    handler saw an answer, or after it). Returns the files removed."""
    removed = []
    for name in (REQUEST, ANSWER):
        path = os.path.join(ckpt_path, name)
        if os.path.exists(path):
            os.remove(path)
            removed.append(path)
    return removed
