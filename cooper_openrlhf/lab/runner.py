"""One arm x seed of the lab as a real `train_cooper` run (its own process, a local Ray cluster, a CPU vLLM engine).

A run's folder is `<lab>/runs/<arm>_seed<k>/`: run.log (the whole output), tensorboard/ and samples/ (what the
report reads), ckpt/. Its run_info.json says who it is and how it ended ({"arm", "seed", "status": "running" |
"done" | "failed", "exit", "log", "seconds"}). A lab that is run again skips "done" runs and starts every other
one afresh, so an interrupted lab resumes without redoing finished work, and a failed run is retried. A run that
failed to start through no fault of its own (START_FAILURES below) is started once more at once. `run_arms` runs a plan of them, up
to `parallel` at a time: on a CPU machine a run keeps about one core busy (one thread per process, its stages mostly
in turn), so two at once on two cores take about the time of the longer one.

A run is its own process group, stopped whole (Ray, vLLM and DeepSpeed processes too) when it times out or
the lab stops -- on an exception, Ctrl-C, or SIGTERM once `stop_runs_on_sigterm` is installed -- so a resumed
lab never restarts a run whose folder an orphan of the last attempt is still writing into; what is left of the
group when a run ends by itself goes too, so the next run does not start beside it.
"""

import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from cooper_openrlhf.lab.arms import ARMS, train_cooper_argv as arm_argv
from cooper_openrlhf.lab.presets import LabPreset
from cooper_openrlhf.runtime.secrets import redact_argv

logger = logging.getLogger(__name__)

RUN_INFO = "run_info.json"  # the name report/runs.py reads
# Failures before a run's first step, through no fault of its own, by a line of its log: the lab starts such a run
# once more. OpenRLHF picks its torch.distributed master port by binding port 0 and releasing it
# (launcher._get_free_port): another process can take that port before DeepSpeed listens on it. And a local Ray
# head gives up when its raylet does not register within Ray's fixed window, which an overloaded machine can miss.
START_FAILURES = {"EADDRINUSE": "lost a race for its master port",
                  "The current node timed out during startup": "its local Ray did not start in time"}
# DeepSpeed's CPU accelerator, one thread per process, a small vLLM KV cache, and no core binding for vLLM: its
# automatic binding pins every engine to the same core, so runs side by side (`run_arms`) would share one core
# while the other idles. Only where torch sees no CUDA.
CPU_ENVIRONMENT = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                   "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass(frozen=True)
class LabFiles:
    """What every run of one lab folder shares."""

    root: Path
    policy: Path
    rm: Path | None  # None: no arm of the lab is paid by an RM, so none was prepared

    @property
    def prompts(self) -> Path:
        return self.root / "data" / "prompts.jsonl"

    @property
    def held_out(self) -> Path:
        return self.root / "data" / "held_out.jsonl"

    @property
    def rm_eval(self) -> Path:
        return self.root / "data" / "rm_eval.jsonl"

    def offline_pairs(self, seed: int) -> Path:
        """The offline_pairs arm's pairs for `seed` (lab/prepare.py writes them)."""
        return self.root / "data" / f"offline_pairs_seed{seed}.jsonl"

    def stale_pairs(self, seed: int) -> Path:
        """The cooper_stale arm's pairs for `seed`: Cooper's, from the starting policy (lab/prepare.py)."""
        return self.root / "data" / f"stale_pairs_seed{seed}.jsonl"

    def oracle_pairs(self, seed: int) -> Path:
        """The oracle arm's pairs for `seed`: the hedge against its exploit form (lab/prepare.py)."""
        return self.root / "data" / f"oracle_pairs_seed{seed}.jsonl"

    def pair_file(self, kind: str, seed: int) -> Path:
        """The pairs file of an arm whose pairs come from one (`Arm.pairs`)."""
        return {"offline": self.offline_pairs, "stale": self.stale_pairs, "oracle": self.oracle_pairs}[kind](seed)

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.root / "runs" / f"{arm}_seed{seed}"


def run_environment() -> dict[str, str]:
    from cooper_openrlhf.runtime import cuda_available

    defaults = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return defaults if cuda_available() else {**defaults, **CPU_ENVIRONMENT}


def train_cooper_argv(preset: LabPreset, files: LabFiles, arm: str, seed: int) -> list[str]:
    """The arm's command: the shared configuration of the preset, then the arm's reward path (lab/arms.py)."""
    run = files.run_dir(arm, seed)
    rollouts_per_step = preset.prompts_per_step * preset.samples_per_prompt
    spec = ARMS[arm]
    shared = [
        "--actor.model_name_or_path", str(files.policy),
        "--data.prompt_dataset", str(files.prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", "1024",
        "--data.max_samples", str(preset.prompts_per_step * preset.steps),
        "--rollout.max_new_tokens", str(preset.max_new_tokens), "--rollout.temperature", str(preset.temperature),
        "--rollout.n_samples_per_prompt", str(preset.samples_per_prompt),
        "--rollout.batch_size", str(preset.prompts_per_step), "--rollout.micro_batch_size", str(rollouts_per_step),
        "--train.batch_size", str(rollouts_per_step), "--train.micro_batch_size", "8", "--train.seed", str(seed),
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", str(preset.kl_coef),
        *(("--algo.kl.use_loss", "--algo.kl.estimator", "k3") if preset.kl_coef > 0 else ()),
        "--actor.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
        *(("--ref.num_gpus_per_node", "1") if preset.kl_coef > 0 else ()),
        "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo", "--vllm.enforce_eager",
        "--ds.attn_implementation", "eager", "--ds.zero_stage", "2",  # --ds.param_dtype auto: the CPU's fast dtype
        "--actor.adam.lr", str(preset.actor_lr), "--actor.lr_warmup_ratio", "0",
        "--actor.lr_scheduler", "constant",  # a decaying lr would hide what late steps do to accuracy
        "--cooper.rm_lr", str(preset.rm_lr), "--cooper.rm_max_length", str(preset.rm_max_length),
        "--cooper.negative_max_new_tokens", str(max(preset.max_new_tokens, 32)),
        "--cooper.hacking_window", str(preset.hacking_window), "--cooper.hacking_rules", preset.hacking_rules,
        *(("--cooper.require_answer",) if preset.require_answer else ()),  # the rule arm pays answerless text 0 anyway
        "--eval.dataset", str(files.held_out), "--eval.steps", str(preset.eval_every),
        "--cooper.probe_prompts", str(preset.probe_prompts),
        "--eval.n_samples_per_prompt", str(preset.eval_samples), "--eval.temperature", str(preset.temperature),
        "--ckpt.path", str(run / "ckpt"), "--ckpt.output_dir", str(run / "final"),
        "--logger.tensorboard_dir", str(run / "tensorboard"), "--cooper.sample_log_dir", str(run / "samples"),
    ]
    return arm_argv(arm, shared, rm=str(files.rm) if files.rm else None, rm_eval=str(files.rm_eval),
                    pairs=str(files.pair_file(spec.pairs, seed)) if spec.pairs else None,
                    assistant_model=str(files.policy) if spec.assistant == "starting_policy" else None)


def read_info(run: Path) -> dict:
    path = run / RUN_INFO
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def with_earlier_runs(files: LabFiles, plan: list[tuple[str, int]], arms: tuple[str, ...]) -> list[tuple[str, int]]:
    """`plan` and, after it, every run an earlier invocation left finished ("done" or "failed") in the lab folder,
    seed-major in the order of `arms` (unknown arms last). An interrupted run ("running") is not one: it is
    started afresh when a lab asks for it again."""
    earlier = []
    for info_path in sorted((files.root / "runs").glob(f"*/{RUN_INFO}")):
        info = read_info(info_path.parent)
        key = (info.get("arm"), info.get("seed"))
        if info.get("status") in ("done", "failed") and key not in plan and info_path.parent == files.run_dir(*key):
            earlier.append(key)
    order = {arm: i for i, arm in enumerate(arms)}
    return plan + sorted(earlier, key=lambda run: (run[1], order.get(run[0], len(order)), run[0]))


def _write_info(run: Path, info: dict) -> None:
    tmp = run / (RUN_INFO + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    tmp.replace(run / RUN_INFO)


def stop_runs_on_sigterm() -> None:
    """Make SIGTERM (`kill`, a batch scheduler's stop) raise SystemExit in the lab's main thread, as Ctrl-C raises
    KeyboardInterrupt, so `_launch` stops the run in progress instead of leaving it running as an orphan."""
    def _exit(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)


STOP_GRACE_S = 10.0  # what a run gets between SIGTERM and SIGKILL


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the run's process group; SIGKILL what is left of it after STOP_GRACE_S; reap the run."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(process.pid, signal.SIGKILL)  # members that outlived the leader, or a leader that held on
    except ProcessLookupError:  # nothing of the group is left
        pass
    process.wait()


def _stop_leftovers(process: subprocess.Popen) -> None:
    """After the run's own process ended: SIGKILL what is left of its group. A run that fails can leave a process
    behind (a vLLM EngineCore outliving its Ray actor, with its KV cache and weights), which the next run would
    start beside and share the machine's memory with."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # nothing of the group is left
        pass


class LabStopped(Exception):
    """A run was stopped because the lab is stopping (its run_info stays "running": a resumed lab redoes it)."""


# The runs in progress, for `run_arms` to stop when the lab stops: signals reach only the main thread, and the
# runs it started side by side wait in other threads.
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _stop_live_runs() -> None:
    with _LIVE_LOCK:  # no run starts after this
        _STOPPING.set()
        live = list(_LIVE)
    for process in live:
        _stop_group(process)


def _launch(argv: list[str], log: Path, timeout_s: float | None) -> int:
    """Run `argv` with its whole output in `log`; its exit status (-9 when killed at `timeout_s`)."""
    with open(log, "w", encoding="utf-8") as out:
        with _LIVE_LOCK:
            if _STOPPING.is_set():
                raise LabStopped(str(log.parent))
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**os.environ, **run_environment()})
            _LIVE.add(process)
        try:
            status = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(process)
            out.write(f"\n[lab] killed after {timeout_s:.0f} s\n")
            return -9
        except BaseException:  # the lab is stopping (Ctrl-C, SIGTERM, an error): the run goes with it
            _stop_group(process)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(process)
        _stop_leftovers(process)
        if _STOPPING.is_set():  # stopped by `_stop_live_runs`, not finished
            raise LabStopped(str(log.parent))
        return status


def run_arm(preset: LabPreset, files: LabFiles, arm: str, seed: int, timeout_s: float | None = None,
            extra_flags: tuple[str, ...] = ()) -> dict:
    """Run (or skip, when already done) one arm x seed; returns its run_info. Never raises for a failed run.
    extra_flags: appended to the arm's command, changing how it logs, not what it trains (`cli.lab --wandb-project`)."""
    run = files.run_dir(arm, seed)
    if read_info(run).get("status") == "done":
        logger.info("%s seed %d: done earlier, skipped (%s)", arm, seed, run)
        return read_info(run)
    if run.exists():  # an interrupted or failed attempt: its partial logs would mix with the new ones
        shutil.rmtree(run)
    run.mkdir(parents=True)
    log = run / "run.log"
    info = {"arm": arm, "seed": seed, "status": "running", "log": str(log), "preset": preset.name}
    _write_info(run, info)
    argv = [*train_cooper_argv(preset, files, arm, seed), *extra_flags]
    (run / "command.txt").write_text(" ".join(redact_argv(argv, os.environ)) + "\n", encoding="utf-8")
    started = time.perf_counter()
    status = _launch(argv, log, timeout_s)
    text = log.read_text(encoding="utf-8", errors="replace") if status != 0 else ""
    cause = next((why for line, why in START_FAILURES.items() if line in text), None)
    if cause:
        log.replace(run / "run.start-failed.log")
        logger.warning("%s seed %d %s; starting it once more (first log: run.start-failed.log)", arm, seed, cause)
        for leftover in ("tensorboard", "samples", "ckpt", "final"):  # nothing of the first attempt mixes in
            shutil.rmtree(run / leftover, ignore_errors=True)
        status = _launch(argv, log, timeout_s)
    info.update(status="done" if status == 0 else "failed", exit=status, seconds=round(time.perf_counter() - started, 1))
    _write_info(run, info)
    if status != 0:
        logger.error("%s seed %d failed (exit %d); its log: %s", arm, seed, status, log)
    return info


def expected_cost(arm: str) -> int:
    """How long an arm's run takes, by rank: 2 with a co-trained RM, 1 with a frozen one, 0 without an RM."""
    spec = ARMS[arm]
    return 2 if spec.trains_rm else int(spec.reward == "rm")


def run_arms(preset: LabPreset, files: LabFiles, plan: list[tuple[str, int]], timeout_s: float | None = None,
             parallel: int = 1, on_done: Callable[[dict], None] | None = None,
             extra_flags: tuple[str, ...] = ()) -> list[dict]:
    """`run_arm` (with `extra_flags`) for each (arm, seed) of `plan`: one at a time in plan order, or up to `parallel` at once, the longest
    first; their run_infos in plan order, `on_done` called with each as it finishes. When the lab stops (an
    exception in this thread: Ctrl-C, SIGTERM, an error, or a run's) every run in progress is stopped with it and
    none is started after."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    # Side by side, the longest runs start first (a co-trained RM, then a frozen one, then none), so the short ones
    # fill in beside them instead of one long run finishing alone.
    order = sorted(range(len(plan)), key=lambda i: -expected_cost(plan[i][0])) if parallel > 1 else range(len(plan))
    _STOPPING.clear()
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="lab-run") as pool:
        started = {i: pool.submit(run_arm, preset, files, *plan[i], timeout_s, extra_flags) for i in order}
        futures = [started[i] for i in range(len(plan))]
        try:
            for future in as_completed(futures):
                if on_done is not None:
                    on_done(future.result())
        except BaseException:
            for future in futures:
                future.cancel()
            _stop_live_runs()
            raise
    return [future.result() for future in futures]
