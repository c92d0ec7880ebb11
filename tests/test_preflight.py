"""The launchers' Python side: the GPU placement rule, the pre-submit checks, prompt preparation, the Ray wait."""

import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest

from cooper_openrlhf.cluster.checks import Env, PreflightError, check_rows_have_keys, check_writable_dir
from cooper_openrlhf.cluster.placement import PlacementError, plan_placement
from cooper_openrlhf.cli.launch_plans import plan_annotate, plan_rl
from cooper_openrlhf.cluster.annotation_shards import merge_annotations, shard_bounds, shard_paths
from cooper_openrlhf.cluster.prompts import INSTRUCTIONS, main as prompts_main
from cooper_openrlhf.cluster.ray_wait import ClusterNotReady, Watched, wait_for_cluster
from launch_bench import _model, _reward_model


# ------------------------------------------------------------------------------------------ placement
@pytest.mark.parametrize("nodes, gpus, arm, assistant, expected", [
    # (actor gpus, actor nodes, rm gpus, vllm engines, assistant gpus, idle)
    (1, 8, "cooper", True, (4, 1, 1, 2, 1, 0)),
    (1, 8, "cooper", False, (4, 1, 1, 3, 0, 0)),
    (1, 8, "rule", True, (4, 1, 0, 4, 0, 0)),       # no RM and no negatives in the rule arm
    (2, 8, "cooper", True, (8, 1, 2, 5, 1, 0)),
    (4, 8, "static", False, (16, 2, 4, 12, 0, 0)),
    (3, 4, "cooper", True, (4, 1, 1, 6, 1, 0)),
])
def test_the_placement_rule_splits_the_allocation_and_uses_every_gpu(nodes, gpus, arm, assistant, expected):
    p = plan_placement(nodes, gpus, arm=arm, assistant_model=assistant)
    assert (p.actor_gpus, p.actor_nodes, p.rm_gpus, p.vllm_engines, p.assistant_gpus,
            p.total_gpus - p.used_gpus) == expected
    flags = p.openrlhf_flags()
    assert flags[flags.index("--actor.num_gpus_per_node") + 1] == str(p.actor_gpus_per_node)
    assert ("--reward.num_gpus_per_node" in flags) == (arm != "rule")
    assert "--train.colocate_actor_ref" in flags


def test_tensor_parallel_engines_and_overrides_are_checked_against_the_allocation():
    p = plan_placement(1, 8, vllm_tp=2, assistant_model=True)  # 8 - 4 - 1 - 1 = 2 GPUs: one TP2 engine
    assert (p.vllm_engines, p.vllm_tp) == (1, 2)
    p = plan_placement(1, 8, vllm_tp=2, actor_gpus=2, rm_gpus=1, assistant_model=True)
    assert p.vllm_engines == 2 and p.total_gpus - p.used_gpus == 0
    shared = plan_placement(1, 8, colocate_all=True, actor_gpus=8, rm_gpus=2)
    assert shared.vllm_engines == 8 and "--train.colocate_all" in shared.openrlhf_flags()


@pytest.mark.parametrize("kwargs, message", [
    (dict(nodes=0, gpus_per_node=8), "NODES=0"),
    (dict(nodes=1, gpus_per_node=0), "GPUS_PER_NODE=0"),
    (dict(nodes=1, gpus_per_node=8, actor_gpus=4, vllm_engines=4), "9 GPUs asked, but NODES=1 x GPUS_PER_NODE=8 = 8"),
    (dict(nodes=1, gpus_per_node=8, actor_gpus=7), "no GPU is left for a vLLM engine"),
    (dict(nodes=2, gpus_per_node=8, actor_gpus=12), "ACTOR_GPUS=12: a role larger than one node"),
    (dict(nodes=1, gpus_per_node=4, vllm_tp=8), "VLLM_TP=8"),
    (dict(nodes=1, gpus_per_node=8, arm="rule", rm_gpus=1), "RM_GPUS=1: the rule arm"),
    (dict(nodes=1, gpus_per_node=8, rm_gpus=0), "RM_GPUS=0"),
    (dict(nodes=1, gpus_per_node=8, colocate_all=True, vllm_engines=2), "COLOCATE_ALL=1 needs"),
    (dict(nodes=1, gpus_per_node=8, arm="ppo"), "ARM='ppo'"),
])
def test_a_placement_that_cannot_run_names_the_variable(kwargs, message):
    nodes, gpus = kwargs.pop("nodes"), kwargs.pop("gpus_per_node")
    with pytest.raises(PlacementError) as raised:
        plan_placement(nodes, gpus, **kwargs)
    assert message in str(raised.value)


# ------------------------------------------------------------------------------------------ checks
def test_env_reads_named_variables_and_fails_naming_them():
    env = Env({"N": "3", "BAD": "x", "ZERO": "0", "F": "1", "C": "mixed"})
    assert env.int("N", 1) == 3 and env.int("MISSING", 7) == 7 and env.flag("F") and not env.flag("MISSING")
    assert env.choice("C", "assistant", ("assistant", "rollout", "mixed")) == "mixed"
    for call, message in [(lambda: env.int("BAD", 1), "BAD='x': must be an integer"),
                          (lambda: env.int("ZERO", 1), "ZERO=0: must be >= 1"),
                          (lambda: env.require("POLICY", "the policy"), "POLICY is not set: the policy"),
                          (lambda: env.choice("C", "a", ("a", "b")), "C='mixed': must be one of a, b")]:
        with pytest.raises(PreflightError) as raised:
            call()
        assert message in str(raised.value)


def test_pending_paths_count_on_the_submit_side_only():
    assert Env({"PENDING_PATHS": "/a/b:/c"}).is_pending("/a/b")
    assert not Env({"PENDING_PATHS": "/a/b", "SLURM_JOB_ID": "7"}).is_pending("/a/b")


def test_data_rows_and_output_folders_are_checked(tmp_path):
    rows = [{"question": "q", "answer": "1"}, {"question": "q2", "answer": " "}]
    with pytest.raises(PreflightError, match=r"PROMPTS=p.jsonl: row 2 has an empty field 'answer' \(set by LABEL_KEY\)"):
        check_rows_have_keys("PROMPTS", "p.jsonl", rows, {"question": "INPUT_KEY", "answer": "LABEL_KEY"})
    with pytest.raises(PreflightError, match="row 1 has no field 'prompt'"):
        check_rows_have_keys("PROMPTS", "p.jsonl", rows, {"prompt": "INPUT_KEY"})
    check_writable_dir("OUT", str(tmp_path / "new" / "run"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(PreflightError, match="OUT=.*: output folder is not writable"):
        check_writable_dir("OUT", str(tmp_path / "file" / "run"))


@pytest.fixture
def rl_env(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"{i} + 1? Let's think", "answer": str(i + 1),
                                           "instruction": "gsm8k-verl"}) + "\n" for i in range(64)))
    return {"POLICY": _model(tmp_path / "policy"), "VERIFY_RM": _reward_model(tmp_path / "rm"),
            "ASSISTANT_MODEL": _model(tmp_path / "assistant"), "PROMPTS": str(prompts), "OUT": str(tmp_path / "out"),
            "ROLLOUT_BATCH_SIZE": "8", "TRAIN_BATCH_SIZE": "32"}


@pytest.mark.parametrize("change, message", [
    ({"POLICY": None}, "POLICY is not set"),
    ({"ASSISTANT_MODEL": None}, "ASSISTANT_MODEL is not set"),
    ({"NODES": "0"}, "NODES=0: must be >= 1"),
    ({"VLLM_ENGINES": "4"}, "= 10 GPUs asked, but NODES=1 x GPUS_PER_NODE=8 = 8 allocated"),
    ({"POLICY": "Qwen/Qwen2.5-1.5B-Instruct"}, "POLICY=Qwen/Qwen2.5-1.5B-Instruct: model folder does not exist (a hub id?"),
    ({"LABEL_KEY": "label"}, "row 1 has no field 'label' (set by LABEL_KEY)"),
    ({"NEGATIVE_SOURCE": "judge"}, "NEGATIVE_SOURCE='judge'"),
    ({"TRAIN_BATCH_SIZE": "24"}, "TRAIN_BATCH_SIZE=24 must be a multiple of MICRO_BATCH_SIZE=4 x 4 actor GPUs"),
    ({"ARM": "ppo"}, "ARM='ppo'"),
])
def test_rl_preflight_fails_before_parsing_naming_the_variable(rl_env, change, message):
    env = {k: v for k, v in {**rl_env, **change}.items() if v is not None}
    with pytest.raises(PreflightError) as raised:
        plan_rl(Env(env))
    assert message in str(raised.value)


def test_rl_plans_parse_with_train_cooper_and_carry_the_official_recipe(rl_env):
    """One process for every parse: train_cooper's parser (OpenRLHF's block) is imported once."""
    from cooper_openrlhf.cli.train_cooper import parse_args

    plans = {arm: plan_rl(Env({**rl_env, "ARM": arm})) for arm in ("cooper", "static", "rule")}
    args = {arm: parse_args(plan.commands[0][3:]) for arm, plan in plans.items()}
    cooper = args["cooper"]
    assert cooper.remote_rm_trainable and cooper.cooper.assistant == "model"
    assert cooper.cooper.assistant_model_path == rl_env["ASSISTANT_MODEL"] and cooper.cooper.negative_source == "assistant"
    assert (cooper.rollout.n_samples_per_prompt, cooper.rollout.temperature) == (16, 1.0)
    assert cooper.actor.lr_scheduler == "constant_with_warmup" and cooper.actor.adam.lr == 1e-6
    assert cooper.data.apply_chat_template and cooper.data.input_template is None
    assert (cooper.vllm.num_engines, cooper.actor.num_gpus_per_node, cooper.reward.num_gpus_per_node) == (2, 4, 1)
    assert not args["static"].remote_rm_trainable and args["static"].reward.model_name_or_path == rl_env["VERIFY_RM"]
    assert args["rule"].cooper.reward_source == "rule" and args["rule"].reward.model_name_or_path is None
    assert plans["rule"].placement.vllm_engines == 4  # the rule arm's RM and assistant GPUs go to rollouts
    # 64 prompts x 16 / 32 = 32 optimizer steps per episode x 15; 20 rollout steps x 4 optimizer steps warm up
    assert math.ceil(32 * 15 * cooper.actor.lr_warmup_ratio) == 20 * 4  # OpenRLHF's num_warmup_steps

    rollout = plan_rl(Env({**rl_env, "NEGATIVE_SOURCE": "rollout", "ASSISTANT_MODEL": ""}))
    assert "--cooper.assistant" not in rollout.commands[0] and rollout.placement.assistant_gpus == 0
    with pytest.raises(PreflightError, match="unrecognized arguments: --cooper.no_such_flag"):
        plan_rl(Env(rl_env), ["--cooper.no_such_flag", "1"])
    with pytest.raises(PreflightError, match="train_cooper rejects the flags for the job's GPU nodes .*--train.async_enable "
                                             "is not supported"):
        plan_rl(Env(rl_env), ["--train.async_enable"])


def test_colocate_all_on_gpus_turns_on_vllm_and_deepspeed_sleep(rl_env):
    """COLOCATE_ALL=1 with --train.colocate_all alone would hold the resident vLLM engine, the actor's states, the
    reference's peak and the RM on one GPU at once (docs/cluster.md: well over 80 GB). On GPUs it turns on both
    sleep modes; CPU mode needs neither (vLLM-CPU has no sleep mode)."""
    from cooper_openrlhf.cli.train_cooper import parse_args

    plan = plan_rl(Env({**rl_env, "COLOCATE_ALL": "1"}))
    args = parse_args(plan.commands[0][3:])
    assert args.train.colocate_all and args.vllm.enable_sleep and args.ds.enable_sleep
    assert plan.placement.vllm_engines == plan.placement.actor_gpus == 4
    cpu = plan_rl(Env({**rl_env, "COLOCATE_ALL": "1", "GPUS_PER_NODE": "0", "ASSISTANT_MODEL": "policy"}))
    assert "--train.colocate_all" in cpu.commands[0]
    assert "--vllm.enable_sleep" not in cpu.commands[0] and "--ds.enable_sleep" not in cpu.commands[0]


def test_device_flags_are_judged_for_the_jobs_nodes_not_the_login_node(rl_env, monkeypatch, capsys):
    """The preflight runs on a login node (here: this CPU machine) for a job on GPU nodes. fp16 is a GPU
    dtype and gloo weight sync a CPU route: judged for GPUS_PER_NODE=8 the first is accepted and the second refused,
    in one line naming the flag and the nodes judged; with GPUS_PER_NODE=0 the other way round."""
    from cooper_openrlhf.cli.preflight import main

    plan = plan_rl(Env(rl_env), ["--ds.param_dtype", "fp16"])
    assert plan.commands[0][-2:] == ["--ds.param_dtype", "fp16"]
    for name, value in rl_env.items():
        monkeypatch.setenv(name, value)
    assert main(["rl", "--", "--vllm.sync_backend", "gloo"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("preflight rl: error: train_cooper rejects the flags for the job's GPU nodes "
                           "(GPUS_PER_NODE=8): --vllm.sync_backend gloo is this package's CPU weight sync"), line
    monkeypatch.setenv("GPUS_PER_NODE", "0")
    monkeypatch.setenv("ASSISTANT_MODEL", "policy")
    assert main(["rl", "--", "--ds.param_dtype", "fp16"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("preflight rl: error: train_cooper rejects the flags for the job's CPU nodes "
                           "(GPUS_PER_NODE=0): --ds.param_dtype fp16: fp16 on CPU is emulated"), line


# ----------------------------------------------------------------------------------- VerifyRM stages
def test_shards_are_contiguous_and_balanced():
    assert shard_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert shard_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_annotate_shards_once_and_refuses_other_prompts_on_resubmission(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"q{i}", "reference": str(i)}) + "\n" for i in range(10)))
    env = {"PROMPTS": str(prompts), "GENERATORS": f"{_model(tmp_path / 'g1')},{_model(tmp_path / 'g2')}",
           "JUDGE": _model(tmp_path / "judge"), "OUT": str(tmp_path / "ann"), "SHARDS": "3"}
    plan = plan_annotate(Env(env))
    assert len(plan.commands) == 3
    first = plan.commands[0]
    assert first[first.index("--prompts") + 1] == shard_paths(env["OUT"], 3)[0][0]
    assert first.count("--generator") == 2 and "tensor_parallel_size=1" in first
    assert [len(open(p).readlines()) for p in shard_paths(env["OUT"], 3)[0]] == [4, 3, 3]
    assert plan_annotate(Env(env)).commands == plan.commands  # a re-submission finds the same shards
    prompts.write_text("".join(json.dumps({"question": f"other {i}", "reference": str(i)}) + "\n" for i in range(10)))
    with pytest.raises(PreflightError, match="holds other prompts .* use a new OUT"):
        plan_annotate(Env(env))
    for change, message in [({"SHARDS": "11"}, "SHARDS=11: more shards than the 10 prompts; set SHARDS to at "
                                                          "most 10, and the same SHARDS for verifyrm_train.sbatch"),
                            ({"JUDGE": str(tmp_path / "nope")}, "JUDGE="),
                            ({"GENERATORS": str(tmp_path / "nope")}, "GENERATORS (item 1)")]:
        with pytest.raises(PreflightError, match=message.replace("(", r"\(").replace(")", r"\)")):
            plan_annotate(Env({**env, "OUT": str(tmp_path / "ann2"), **change}))


def test_merge_waits_for_every_shard_then_concatenates(tmp_path):
    out = str(tmp_path / "ann")
    shards, parts = shard_paths(out, 2)
    for path in (shards[0], parts[0]):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    for shard in shards:  # what annotate's check leaves before it submits
        open(shard, "w").write("")
    for k, part in enumerate(parts):
        with open(part, "w") as handle:
            handle.write(json.dumps({"question": "q", "reference": "1", "completion": "c", "label": k}) + "\n")
    open(parts[0].replace(".jsonl", ".summary.json"), "w").write("{}")
    with pytest.raises(PreflightError, match="1 of 2 shards have not finished"):
        merge_annotations(out, 2, str(tmp_path / "merged.jsonl"))
    open(parts[1].replace(".jsonl", ".summary.json"), "w").write("{}")
    assert merge_annotations(out, 2, str(tmp_path / "merged.jsonl")) == 2


def test_merge_with_another_shards_than_annotates_names_the_shards_annotate_ran_with(tmp_path):
    """A small data set makes a user lower SHARDS for annotate; the training job's merge with the default 8 used to
    blame unfinished shards ("re-submit the annotate array"), the wrong fix."""
    out = str(tmp_path / "ann")
    shards, parts = shard_paths(out, 4)
    for path in (shards[0], parts[0]):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    for shard, part in zip(shards, parts):
        open(shard, "w").write("")
        open(part, "w").write("")
        open(part.replace(".jsonl", ".summary.json"), "w").write("{}")
    with pytest.raises(PreflightError, match=r"^SHARDS=8: ANNOTATED=.* was split into 4 shards .*set SHARDS=4"):
        merge_annotations(out, 8, str(tmp_path / "merged.jsonl"))
    with pytest.raises(PreflightError, match="no shards/prompts-KKK-of-NNN.jsonl in it: give the OUT folder"):
        merge_annotations(str(tmp_path), 4, str(tmp_path / "merged.jsonl"))
    assert merge_annotations(out, 4, str(tmp_path / "merged.jsonl")) == 0


# ------------------------------------------------------------------------------------------- prompts
def test_prompt_preparation_puts_the_instruction_into_the_question(tmp_path):
    source = tmp_path / "train.jsonl"
    source.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}) + "\n")
    out = tmp_path / "prompts.jsonl"
    assert prompts_main(["--input", str(source), "--format", "gsm8k", "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["question"] == "What is 2 + 3? " + INSTRUCTIONS["gsm8k-verl"]
    assert (row["answer"], row["instruction"]) == ("5", "gsm8k-verl")
    assert prompts_main(["--input", str(source), "--format", "gsm8k", "--out", str(out), "--instruction", "boxed"]) == 0
    assert json.loads(out.read_text())["question"].endswith("within \\boxed{}.")


# ------------------------------------------------------------------------------------------ Ray wait
def _dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_wait_returns_when_every_gpu_joined_and_fails_naming_the_node_and_log(tmp_path):
    node = {"state": "ALIVE", "resources_total": {"GPU": 8.0}, "node_ip": "10.0.0.1"}
    answers = iter([None, [node], [node, {**node, "node_ip": "10.0.0.2"}]])
    alive = wait_for_cluster("h:6379", 2, 16, [], 10, 10, poll_s=0, list_nodes=lambda address: next(answers))
    assert len(alive) == 2

    head = Watched("node0", os.getpid(), "/logs/ray-node0.log")
    with pytest.raises(ClusterNotReady, match=r"head at h:6379 did not answer within 0 s; its log: /logs/ray-node0.log"):
        wait_for_cluster("h:6379", 2, 16, [head], 0, 10, poll_s=0, list_nodes=lambda address: None)
    worker = Watched("node1", _dead_pid(), "/logs/ray-node1.log")
    with pytest.raises(ClusterNotReady, match="worker on node1 exited .* /logs/ray-node1.log"):
        wait_for_cluster("h:6379", 2, 16, [head, worker], 10, 10, poll_s=0, list_nodes=lambda address: [node])
    # A node's log that can be read from here: its last lines are quoted, so the job's output says why.
    log = tmp_path / "ray-node1.log"
    log.write_text("Local node IP: 127.0.0.1\n" + "".join(f"line {i}\n" for i in range(20))
                   + "OSError: [Errno 98] Address already in use: ('127.0.0.1', 17001)\n")
    with pytest.raises(ClusterNotReady) as failed:
        wait_for_cluster("h:6379", 2, 16, [head, Watched("node1", _dead_pid(), str(log))], 10, 10, poll_s=0,
                         list_nodes=lambda address: [node])
    assert str(failed.value).endswith("line 19\n    OSError: [Errno 98] Address already in use: ('127.0.0.1', 17001)")
    assert "Local node IP" not in str(failed.value), "only the end of the log"
    # A head that started but never answers (its dashboard died on an overloaded node): the timeout quotes the
    # log's error lines, which sit above the "Ray runtime started" banner, not at the end.
    head_log = tmp_path / "ray-node0.log"
    head_log.write_text("Local node IP: 192.0.2.2\n"
                        "2026-11-26 09:43:55,069\tERROR dashboard.py:326 -- The dashboard on node vm failed with the "
                        "following error:\nTraceback (most recent call last):\n  File \"head.py\", line 1\n"
                        "RuntimeError: Module MetricsHead failed to start. Timeout after 30.0 seconds.\n"
                        "SUCC scripts.py:980 -- Ray runtime started.\n" + "".join(f"banner {i}\n" for i in range(20)))
    with pytest.raises(ClusterNotReady) as failed:
        wait_for_cluster("h:6379", 2, 16, [Watched("node0", os.getpid(), str(head_log))], 0, 10, poll_s=0,
                         list_nodes=lambda address: None)
    assert str(failed.value).endswith("\n    2026-11-26 09:43:55,069\tERROR dashboard.py:326 -- The dashboard on node vm "
                                      "failed with the following error:\n    RuntimeError: Module MetricsHead failed to "
                                      "start. Timeout after 30.0 seconds."), str(failed.value)
    with pytest.raises(ClusterNotReady, match=r"only 1 of 2 nodes \(8 of 16 GPUs\) joined .* /logs/ray-node1.log"):
        wait_for_cluster("h:6379", 2, 16, [head, Watched("node1", os.getpid(), "/logs/ray-node1.log")], 10, 0,
                         poll_s=0, list_nodes=lambda address: [node])


# ------------------------------------------------------------------------ cluster path
def test_every_rl_plan_resumes_from_checkpoints_and_cpu_mode_changes_only_the_device_routes(rl_env, tmp_path):
    from cooper_openrlhf.cli.train_cooper import parse_args

    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
    gpu = plan_rl(Env({**rl_env, "EVAL_PROMPTS": str(held), "EVAL_STEPS": "5"}))
    cpu = plan_rl(Env({**rl_env, "EVAL_PROMPTS": str(held), "EVAL_STEPS": "5", "GPUS_PER_NODE": "0", "NODES": "2"}))
    for plan in (gpu, cpu):
        args = parse_args(plan.commands[0][3:])
        assert args.ckpt.load_enable and args.ckpt.save_steps == 20
        assert (args.eval.dataset, args.eval.steps) == (str(held), 5)
    assert parse_args(gpu.commands[0][3:]).vllm.sync_backend == "nccl"
    cpu_args = parse_args(cpu.commands[0][3:])
    assert cpu_args.vllm.sync_backend == "gloo" and cpu_args.ds.attn_implementation == "eager"
    # One slot per role (actor+ref, RM, engine, assistant), spread over the 2 nodes: 2 per node.
    assert (cpu.placement.gpus_per_node, cpu.placement.actor_gpus, cpu.placement.rm_gpus, cpu.placement.vllm_engines) == (2, 1, 1, 1)
    assert cpu.runtime_env["worker_process_setup_hook"] == "cooper_openrlhf.runtime.cpu.install"
    assert cpu.runtime_env["env_vars"]["DS_ACCELERATOR"] == "cpu"


def test_a_checkpoint_folder_resumes_only_under_the_configuration_that_wrote_it(rl_env):
    from cooper_openrlhf.cluster.launch_record import record_attempt, record_end
    from cooper_openrlhf.cluster.launch_record import check_resumable

    out = rl_env["OUT"]
    job = {**rl_env, "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1", "ARM": "static"}
    env = Env(job)  # the CLI records with the Env it planned with: the variables it read
    plan = plan_rl(env)
    record_attempt(os.path.join(out, "launch.json"), plan, plan.commands[0], env)
    os.makedirs(os.path.join(out, "ckpt", "_actor"))
    check_resumable(out, plan_rl(Env({**job, "SLURM_JOB_ID": "8"})).commands[0])  # another attempt: same configuration
    with pytest.raises(PreflightError, match=r"--train.seed: '42' then, '3' now"):
        plan_rl(Env({**job, "SEED": "3"}))
    record_end(out, 0)
    record = json.loads(open(os.path.join(out, "launch.json")).read())
    (attempt,) = record["attempts"]
    assert (attempt["job_id"], attempt["restart_count"], attempt["exit"]) == ("7", 1, 0)
    assert attempt["env"]["ARM"] == "static" and "PROMPTS" in attempt["env"]
    info = json.loads(open(os.path.join(out, "run_info.json")).read())
    assert (info["arm"], info["seed"], info["status"]) == ("static", 42, "done")
    os.remove(os.path.join(out, "launch.json"))
    with pytest.raises(PreflightError, match="has no launch.json"):
        plan_rl(Env(job))


def test_nodes_must_match_the_allocation_inside_the_job(rl_env):
    with pytest.raises(PreflightError, match=r"NODES=2: the job's allocation has 1 node\(s\)"):
        plan_rl(Env({**rl_env, "NODES": "2", "SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "1"}))


def test_the_prompt_split_keeps_held_out_rows_out_of_training(tmp_path):
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(10)))
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    assert prompts_main(["--input", str(source), "--format", "gsm8k", "--out", str(train), "--heldout", "3",
                         "--heldout-out", str(held)]) == 0
    train_rows = [json.loads(line) for line in train.read_text().splitlines()]
    held_rows = [json.loads(line) for line in held.read_text().splitlines()]
    assert len(train_rows) == 7 and len(held_rows) == 3
    assert not {r["index"] for r in train_rows} & {r["index"] for r in held_rows}


def test_ray_stop_recognises_only_its_own_clusters_processes():
    from cooper_openrlhf.cluster.ray_stop import belongs_to

    assert belongs_to(["raylet", "--gcs-address=10.0.0.1:16000"], 16000)
    assert belongs_to(["gcs_server", "--gcs_server_port=16000"], 16000)
    assert belongs_to(["ray", "start", "--address", "10.0.0.1:16000"], 16000)
    assert not belongs_to(["raylet", "--gcs-address=10.0.0.1:160001"], 16000)
    assert not belongs_to(["raylet", "--gcs-address=10.0.0.1:6379"], 16000)


def test_ray_logs_keeps_its_own_clusters_worker_output_after_ray_has_ended(tmp_path):
    """ray_logs records, while the cluster runs, the log folder its raylet names; at exit, with Ray gone, it copies
    what that cluster's workers and job drivers printed, and nothing of another cluster's or of Ray's own logs; a
    record made on another host copies nothing (the same path there is another node's folder)."""
    from cooper_openrlhf.cluster.ray_logs import main as ray_logs_main

    ours, theirs, node_dir = tmp_path / "session_a" / "logs", tmp_path / "session_b" / "logs", tmp_path / "kept" / "n1"
    for logs in (ours, theirs):
        logs.mkdir(parents=True)
        (logs / "job-driver-raysubmit_1.log").write_text("driver\n")
        (logs / "raylet.out").write_text("ray's own\n")
    sleeper = "import time; time.sleep(60)"
    # Stand-ins for two clusters' raylets: what ray_logs reads of a process is its command line.
    raylets = [subprocess.Popen([sys.executable, "-c", sleeper, f"--gcs-address=127.0.0.1:{port}", f"--log_dir={logs}"])
               for port, logs in ((17001, ours), (17002, theirs))]
    try:
        time.sleep(0.5)
        assert ray_logs_main(["record", "--port", "17001", "--to", str(node_dir)]) == 0
    finally:
        for raylet in raylets:
            raylet.kill()
            raylet.wait()
    # Written after the record (an attempt's last lines), read once the cluster has ended.
    for logs in (ours, theirs):
        (logs / "worker-01-02-7.err").write_text(f"Global step 3: {logs.parent.name}\n")
    assert ray_logs_main(["keep", "--dir", str(node_dir)]) == 0
    assert sorted(p.name for p in node_dir.iterdir()) == ["job-driver-raysubmit_1.log", "ray_log_dirs.json",
                                                           "worker-01-02-7.err"]
    assert (node_dir / "worker-01-02-7.err").read_text() == "Global step 3: session_a\n"

    elsewhere = tmp_path / "kept" / "n2"
    elsewhere.mkdir()
    record = json.loads((node_dir / "ray_log_dirs.json").read_text())
    (elsewhere / "ray_log_dirs.json").write_text(json.dumps({**record, "host": "another-host"}))
    assert ray_logs_main(["keep", "--dir", str(elsewhere)]) == 0
    assert [p.name for p in elsewhere.iterdir()] == ["ray_log_dirs.json"]


def test_a_damaged_last_checkpoint_is_refused_naming_it(rl_env):
    from cooper_openrlhf.cluster.launch_record import record_attempt

    out = rl_env["OUT"]
    env = Env({**rl_env, "SLURM_JOB_ID": "7"})
    plan = plan_rl(env)
    record_attempt(os.path.join(out, "launch.json"), plan, plan.commands[0], env)
    for model in ("_actor", "_rm"):
        for step in (1, 2):
            os.makedirs(os.path.join(out, "ckpt", model, f"global_step{step}"))
            open(os.path.join(out, "ckpt", model, f"global_step{step}", "mp_rank_00_model_states.pt"), "w").close()
        open(os.path.join(out, "ckpt", model, "latest"), "w").write("global_step2")
    plan_rl(Env(rl_env))  # whole: resumes
    os.remove(os.path.join(out, "ckpt", "_rm", "global_step2", "mp_rank_00_model_states.pt"))
    with pytest.raises(PreflightError, match=r"the checkpoint .*_rm/global_step2 it resumes from is damaged"):
        plan_rl(Env(rl_env))
    # The RM's `latest` one step behind the policy's (a folder from before the pair markers): the policy's step-2
    # save finished, the RM's was cut; both hold step 1 whole, and the job resumes there, saying so.
    open(os.path.join(out, "ckpt", "_rm", "latest"), "w").write("global_step1")
    resumed = plan_rl(Env(rl_env))
    assert (f"OUT={out}: resuming at step 1 from the policy's global_step1 and the RM's global_step1: the save of "
            "global_step2 was cut (the policy's `latest` named global_step2, the RM's global_step1)") in resumed.notes
    # Step 2's evaluation was the best so far: OpenRLHF saved the policy again as best_global_step2 and pointed its
    # `latest` there. Before the RM kept best tags its `latest` stayed at the same step's global_step2: resumes.
    open(os.path.join(out, "ckpt", "_rm", "latest"), "w").write("global_step2")
    open(os.path.join(out, "ckpt", "_rm", "global_step2", "mp_rank_00_model_states.pt"), "w").close()
    best = os.path.join(out, "ckpt", "_actor", "best_global_step2")
    os.makedirs(best)
    open(os.path.join(best, "mp_rank_00_model_states.pt"), "w").close()
    open(os.path.join(out, "ckpt", "_actor", "latest"), "w").write("best_global_step2")
    plan_rl(Env(rl_env))
    # No step whole in both: refused, naming the folder.
    for tag in ("global_step1", "global_step2"):
        shutil.rmtree(os.path.join(out, "ckpt", "_actor", tag))
    open(os.path.join(out, "ckpt", "_rm", "latest"), "w").write("global_step1")
    with pytest.raises(PreflightError, match=rf"OUT={out}: no step of its checkpoints is whole in both models"):
        plan_rl(Env(rl_env))


def test_after_a_best_save_off_the_save_steps_the_job_resumes_both_models_from_the_best_tag(rl_env):
    """Step 3's evaluation was the best so far and 3 is no --ckpt.save_steps step, so the policy and the RM
    were saved as best_global_step3 only, and both `latest` files name it. The preflight judges the folders the
    trainer loads (`checkpoint_tags.resume_point`): it names them, and refuses when the RM's is damaged."""
    from cooper_openrlhf.cluster.launch_record import record_attempt

    out = rl_env["OUT"]
    env = Env({**rl_env, "SLURM_JOB_ID": "7"})
    plan = plan_rl(env)
    record_attempt(os.path.join(out, "launch.json"), plan, plan.commands[0], env)
    for model in ("_actor", "_rm"):
        for tag in ("global_step2", "best_global_step3"):
            os.makedirs(os.path.join(out, "ckpt", model, tag))
            open(os.path.join(out, "ckpt", model, tag, "mp_rank_00_model_states.pt"), "w").close()
        open(os.path.join(out, "ckpt", model, "latest"), "w").write("best_global_step3")
    resumed = plan_rl(Env(rl_env))
    loads = [os.path.join(out, "ckpt", model, "best_global_step3") for model in ("_actor", "_rm")]
    assert f"OUT={out}: the job resumes from {loads[0]} and {loads[1]}" in resumed.notes
    os.remove(os.path.join(loads[1], "mp_rank_00_model_states.pt"))
    with pytest.raises(PreflightError, match=r"the checkpoint .*_rm/best_global_step3 it resumes from is damaged"):
        plan_rl(Env(rl_env))
