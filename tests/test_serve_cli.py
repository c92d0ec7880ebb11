"""`cli.serve`'s refusals: one `error:` line per mistake, naming the flag, before anything loads."""

import shlex
import stat
import subprocess
import sys

import pytest

from cooper_openrlhf.cli.serve import main, read_token


def _errors(capsys, argv) -> list[str]:
    assert main(argv) == 2
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]


def test_listening_beyond_loopback_needs_a_token(capsys, model_dir):
    rm, policy = model_dir("tiny-qwen2-rm"), model_dir("tiny-qwen2-policy")
    errors = _errors(capsys, ["--rm", rm, "--policy", policy, "--host", "0.0.0.0"])
    assert errors == ["error: --host 0.0.0.0 is reachable beyond this machine; pass --token-file (clients then send "
                      "the token), or bind 127.0.0.1"]


def test_learning_needs_its_step_size_and_a_state_dir(capsys, model_dir, tmp_path):
    errors = _errors(capsys, ["--rm", str(tmp_path / "nope"), "--no-chat-template", "--learn",
                              "--negative-source", "assistant"])
    assert errors == [f"error: --rm {tmp_path / 'nope'}: no such folder",
                      "error: --learn needs --groups-per-update (the trainer's prompts per step)",
                      "error: --learn needs --state-dir (checkpoints: nothing learned is lost on a restart)",
                      "error: --negative-source assistant needs --assistant-url and --assistant-model"]


def test_at_least_the_live_checkpoint_is_kept(capsys, model_dir, tmp_path):
    errors = _errors(capsys, ["--rm", model_dir("tiny-qwen2-rm"), "--no-chat-template", "--learn",
                              "--groups-per-update", "4", "--state-dir", str(tmp_path), "--keep-checkpoints", "0"])
    assert errors == ["error: --keep-checkpoints must be >= 1 (the checkpoint a restart loads is never deleted)"]


def test_prompt_format_must_be_said(capsys, model_dir):
    rm = model_dir("tiny-qwen2-rm")
    assert _errors(capsys, ["--rm", rm]) == [
        "error: --policy PATH (whose chat template built the prompts) or --no-chat-template is required"]
    assert _errors(capsys, ["--rm", rm, "--policy", model_dir("tiny-qwen2-policy"), "--input-template", "Q: {}"]) == [
        "error: --input-template applies only with --no-chat-template (as OpenRLHF's --data.input_template)"]


def test_a_short_token_is_refused_with_the_command_that_makes_a_good_one(model_dir, tmp_path):
    token = tmp_path / "token"
    token.write_text("short\n")
    with pytest.raises(SystemExit, match="at least 16") as refused:
        main(["--rm", model_dir("tiny-qwen2-rm"), "--no-chat-template", "--token-file", str(token)])
    make_one = str(refused.value).split("Make one: ", 1)[1]
    subprocess.run(make_one.replace("python", shlex.quote(sys.executable), 1), shell=True, check=True)
    assert len(read_token(str(token))) >= 16 and stat.S_IMODE(token.stat().st_mode) == 0o600


def test_the_replicated_service_flags_are_checked(capsys, model_dir):
    base = ["--rm", model_dir("tiny-qwen2-rm"), "--no-chat-template"]
    assert _errors(capsys, [*base, "--ray-address", "auto"]) == [
        "error: --ray-address applies only with --replicas (one process starts no Ray)"]
    assert _errors(capsys, [*base, "--replicas", "-1"]) == ["error: --replicas must be >= 0 and --ingress-replicas >= 1"]
    # flags that would do nothing are refused: probes are read at steps; only a learning service trains an RM to export
    heldout = model_dir("tiny-qwen2-rm") + "/config.json"  # any file: the check names the missing flag first
    assert "error: --probe-every reads the probe suite at rounds, which need --groups-per-update" in _errors(
        capsys, [*base, "--probe-every", "2", "--probe-prompts", heldout])
    assert _errors(capsys, [*base, "--export-dir", "out"]) == [
        "error: --export-dir exports the RM --learn trains; without it the RM is the one given (--rm)"]
    # each scoring replica has one verifier pool: a lane count would be silently ignored
    assert _errors(capsys, [*base, "--replicas", "2", "--verify-lanes", "4"]) == [
        "error: --verify-lanes applies to one process; with --replicas each scoring replica has one verifier pool "
        "(scale the verification with --replicas), got --verify-lanes 4"]


def test_serves_deployment_config_survives_protobuf_7_with_the_upstream_fix():
    """Ray Serve 2.55 reads `FieldDescriptor.label`, which protobuf 7 removed: every `serve.run` failed in the
    controller (serve/replicated/compat.py). With the fix installed the config round-trips through its proto."""
    from ray.serve._private.config import DeploymentConfig

    from cooper_openrlhf.serve.replicated import compat

    compat.install()
    config = DeploymentConfig(num_replicas=3, max_ongoing_requests=7, user_config={"a": [1, 2]})
    back = DeploymentConfig.from_proto_bytes(config.to_proto_bytes())
    assert (back.num_replicas, back.max_ongoing_requests, back.user_config) == (3, 7, {"a": [1, 2]})


@pytest.mark.parametrize("given, shown", [(None, "GOMP_SPINCOUNT = '0'"), ("ACTIVE", "OMP_WAIT_POLICY = 'ACTIVE'")])
def test_the_rms_openmp_threads_sleep_rather_than_spin_unless_the_user_says(given, shown):
    """The RM's OpenMP threads share the cores with the event loop and the verifier workers: at a barrier they sleep
    (libgomp's default spins, taking the CPU those need), unless the user chose a policy. libgomp shows what it
    runs with (OMP_DISPLAY_ENV) when torch loads it, which `cooper serve` does while building its parser."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    if given:
        env["OMP_WAIT_POLICY"] = given
    run = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.serve", "--help"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and shown in run.stderr + run.stdout
