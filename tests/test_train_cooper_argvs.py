"""The train_cooper command every builder of one writes, against a record of what it wrote (tests/data/).

Three places build an arm's train_cooper command: the lab (`lab.runner.train_cooper_argv`, every preset x arm), the
cluster launcher (`plan_rl`, from its variables) and the GPU smoke test (`gpu_smoke.stage_commands`). A change to
the shared arm table or argv builder must not change what any of them runs unnoticed: the launcher's command word
for word (its configuration is recorded in launch.json, and a requeued job resumes only under the same words), the
lab's and the smoke test's flag for flag (each flag with its value; their order means nothing to train_cooper).

A deliberate change: `python tests/test_train_cooper_argvs.py` rewrites the record; the diff shows what changed.
"""

import json
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parent / "data" / "train_cooper_argvs.json"


def _launcher_argvs(root: Path) -> dict[str, list[str]]:
    from cooper_openrlhf.cluster.checks import Env
    from cooper_openrlhf.cli.launch_plans import plan_rl

    def model(path: Path, config: dict | None = None) -> str:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config or {}))
        return str(path)

    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1), "instruction": "gsm8k-verl"})
                               + "\n" for i in range(64)))
    env = {"POLICY": model(root / "policy"), "ASSISTANT_MODEL": model(root / "assistant"), "PROMPTS": str(prompts),
           "VERIFY_RM": model(root / "rm", {"architectures": ["Qwen2ForSequenceClassification"],
                                            "model_type": "qwen2", "num_labels": 1}),
           "OUT": str(root / "out"), "ROLLOUT_BATCH_SIZE": "8", "TRAIN_BATCH_SIZE": "32"}
    cases = {"cooper": {}, "static": {"ARM": "static"}, "rule": {"ARM": "rule"},
             "cooper-rollout": {"NEGATIVE_SOURCE": "rollout", "ASSISTANT_MODEL": ""},
             "cooper-policy-cpu": {"ASSISTANT_MODEL": "policy", "GPUS_PER_NODE": "0", "RM_LR": "3e-5"},
             "static-eval": {"ARM": "static", "EVAL_PROMPTS": str(prompts), "SEED": "3"}}
    return {name: plan_rl(Env({**env, **change})).commands[0] for name, change in cases.items()}


def _lab_argvs(root: Path) -> dict[str, list[str]]:
    from cooper_openrlhf.lab.presets import ARMS, PRESETS
    from cooper_openrlhf.lab.runner import LabFiles, train_cooper_argv

    files = LabFiles(root=root / "lab", policy=root / "lab" / "policy", rm=root / "lab" / "verifyrm" / "best")
    return {f"{preset}/{arm}": train_cooper_argv(PRESETS[preset], files, arm, seed=1)
            for preset in sorted(PRESETS) for arm in ARMS}


def _smoke_argvs(root: Path) -> dict[str, list[str]]:
    from cooper_openrlhf.cli import gpu_smoke

    out = root / "smoke"
    commands = gpu_smoke.stage_commands(out, gpu_smoke.write_inputs(out), lambda name: str(root / "models" / name))
    return {f"{stage}/{k}": argv for stage in gpu_smoke.TRAINING_STAGES for k, argv in enumerate(commands[stage])
            if "cooper_openrlhf.cli.train_cooper" in argv}


def built_argvs(root: Path) -> dict[str, dict[str, list[str]]]:
    """Every builder's commands, with the folder and the interpreter written as <root> and <python>."""
    def portable(argv):
        return [word.replace(str(root), "<root>") if word != sys.executable else "<python>" for word in argv]

    built = {"launcher": _launcher_argvs(root), "lab": _lab_argvs(root), "smoke": _smoke_argvs(root)}
    return {builder: {name: portable(argv) for name, argv in argvs.items()} for builder, argvs in built.items()}


def flag_values(argv: list[str]) -> list[tuple[str, str]]:
    """[(flag, the words after it up to the next flag)], sorted: the command as train_cooper's parser reads it."""
    pairs, flag, words = [], None, []
    for word in [*argv[3:], "--end"]:
        if word.startswith("--"):
            if flag is not None:
                pairs.append((flag, " ".join(words)))
            flag, words = word, []
        else:
            words.append(word)
    return sorted(pairs)


def test_every_builder_writes_the_recorded_train_cooper_command(tmp_path):
    recorded, built = json.loads(RECORD.read_text()), built_argvs(tmp_path)
    assert set(built) == set(recorded)
    for builder in built:
        assert sorted(built[builder]) == sorted(recorded[builder]), builder
        for name, argv in built[builder].items():
            old = recorded[builder][name]
            assert argv[:3] == old[:3], (builder, name)
            if builder == "launcher":
                assert argv == old, name  # word for word: launch.json's configuration
            else:
                assert flag_values(argv) == flag_values(old), (builder, name)


def _arm_settings(argv: list[str], root: Path, gpu_run: bool) -> dict:
    """What train_cooper makes of the arm part of `argv`: where the reward comes from and how the RM learns."""
    from cooper_openrlhf.cli.train_cooper import parse_args

    args = parse_args([word.replace("<root>", str(root)) for word in argv[3:]], gpu_run=gpu_run)
    cooper = args.cooper
    return {"reward_source": cooper.reward_source, "paid by an RM": args.reward.model_name_or_path is not None,
            "RM trained": args.remote_rm_trainable,
            "negative_source": cooper.negative_source if args.remote_rm_trainable else None,
            "negative_validity": cooper.negative_validity, "answerless_negatives": cooper.answerless_negatives,
            "pairs from a file": cooper.offline_pairs is not None}


def test_the_lab_the_launcher_and_the_smoke_test_build_the_same_arm_the_same_way(tmp_path):
    """The paper's three arms as the lab runs them and as the cluster launcher runs them, and Cooper's as the GPU
    smoke test runs it, parsed by train_cooper itself: the same reward source, the same RM update, the same
    negatives. Catches a builder that writes an arm's flags by hand and drifts from cluster/arms.py."""
    from cooper_openrlhf.cluster.arms import ARMS, PAPER_ARMS

    built = built_argvs(tmp_path)
    (tmp_path / "lab" / "data").mkdir(parents=True, exist_ok=True)
    settings = {}
    for arm in PAPER_ARMS:
        lab = _arm_settings(built["lab"][f"full/{arm}"], tmp_path, gpu_run=False)
        launcher = _arm_settings(built["launcher"][arm], tmp_path, gpu_run=True)
        assert lab == launcher, arm
        settings[arm] = lab
    for name, argv in built["smoke"].items():
        assert _arm_settings(argv, tmp_path, gpu_run=True) == settings["cooper"], name
    # The three differ from each other in what the table says, so the comparison above has something to compare.
    assert [settings[arm]["reward_source"] for arm in PAPER_ARMS] == ["rm", "rm", "rule"]
    assert [settings[arm]["RM trained"] for arm in PAPER_ARMS] == [ARMS[arm].trains_rm for arm in PAPER_ARMS]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        built = built_argvs(Path(folder))
    RECORD.write_text("{\n" + ",\n".join(  # one command a line: a change reads as a one-line diff
        f"{json.dumps(builder)}: {{\n" + ",\n".join(f"  {json.dumps(name)}: {json.dumps(argv)}" for name, argv in argvs.items())
        + "\n}" for builder, argvs in built.items()) + "\n}\n")
    print(f"wrote {RECORD}")
