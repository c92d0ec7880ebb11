"""benchmarks/serve_cpu_breakdown.py's pure parts: which component a stack or a process is, py-spy's raw lines,
the sharing of a thread's CPU over its samples, the per-sample table."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "serve_cpu_breakdown", Path(__file__).resolve().parent.parent / "benchmarks" / "serve_cpu_breakdown.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

RM = "RM forward (scorer: tokenize, forward)"
HTTP = "HTTP and event loop (uvicorn, ASGI app)"
VALIDATION = "request validation (decode, parse, check, split)"
SERVICE = "service (groups, rewards, answers)"


def test_the_innermost_frame_that_matches_names_the_component():
    # the lone forward runs inline on the event loop: under uvicorn, the app, the batcher and the RM scorer
    stack = [("torch/nn/modules/module.py", "Module._call_impl"),
             ("cooper_openrlhf/rm/scorer.py", "RMScorer.logits_of"), ("cooper_openrlhf/serve/batcher.py", "_timed"),
             ("cooper_openrlhf/serve/service.py", "score"), ("cooper_openrlhf/serve/app.py", "get_reward"),
             ("uvicorn/server.py", "Server.serve")]
    assert bench.component_of_frames(stack) == RM
    assert bench.component_of_frames(stack[2:]) == "batcher"
    assert bench.component_of_frames(stack[3:]) == SERVICE
    assert bench.component_of_frames(stack[4:]) == HTTP
    # asyncio's own frames name nothing: the loop's work falls to what runs it
    assert bench.component_of_frames([("asyncio/queues.py", "Queue.get"), *stack[5:]]) == HTTP
    assert bench.component_of_frames([("threading.py", "Thread.run")]) == bench.OTHER


def test_a_function_rule_takes_its_function_only_qualified_or_not():
    app = "/x/cooper_openrlhf/serve/app.py"
    assert bench.component_of_frames([(app, "build_app.<locals>.samples_of")]) == VALIDATION
    assert bench.component_of_frames([(app, "decode_json")]) == VALIDATION
    assert bench.component_of_frames([(app, "send_json")]) == HTTP
    assert bench.component_of_frames([("cooper_openrlhf/serve/protocol.py", "build_response")]) == HTTP
    assert bench.component_of_frames([("cooper_openrlhf/serve/protocol.py", "PromptSplitter.split")]) == VALIDATION


def test_processes_are_named_by_title_and_the_verifier_by_its_scoring_replica():
    scorer = "ray::ServeReplica:cooper-serve:Scorer"
    assert bench.component_of_process(scorer, ["raylet", "python -m cooper_openrlhf.cli.serve"]).startswith("scorer")
    assert bench.component_of_process("ray::ServeReplica:cooper-serve:Ingress", []).startswith("ingress")
    assert bench.component_of_process("ray::ProxyActor", []) == "Serve proxy"
    assert bench.component_of_process("ray::GroupRegistry", []).startswith("registry")
    forkserver = "python -c from multiprocessing.forkserver import main; main(7, 8, sys_path=['/v/site-packages/ray/'])"
    assert bench.component_of_process(forkserver, [forkserver, scorer, "raylet"]) == bench.VERIFIER_POOL
    assert bench.component_of_process(forkserver, ["raylet"]).startswith("Ray core")
    assert bench.component_of_process("ray::IDLE", ["raylet"]) == "idle Ray workers"
    assert bench.component_of_process("python -m some.other.thing", []) == bench.OTHER


def test_cpu_delta_counts_new_processes_from_their_start_and_drops_ended_ones():
    before = {1: ("a", 2.0), 2: ("b", 5.0), 3: ("a", 1.0)}
    after = {1: ("a", 2.5), 3: ("a", 1.25), 4: ("b", 0.75)}  # 2 ended, 4 started
    assert bench.cpu_delta(before, after) == pytest.approx({"a": 0.75, "b": 0.75})


def test_py_spy_raw_lines_become_samples_per_thread_and_component():
    lines = [
        "thread (4242): MainThread;Server.serve (uvicorn/server.py:68);get_reward (cooper_openrlhf/serve/app.py:190);"
        "build_app.<locals>.samples_of (cooper_openrlhf/serve/app.py:180) 3\n",
        "thread (4242): MainThread;Server.serve (uvicorn/server.py:68) 5\n",
        "thread (0x10): asyncio_0;_worker (concurrent/futures/thread.py:83);"
        "RMScorer.logits_of (cooper_openrlhf/rm/scorer.py:99);forward (torch/nn/modules/module.py:1) 7\n",
        "\n", "not a sample line\n",
    ]
    assert bench.parse_py_spy_raw(lines) == {4242: {VALIDATION: 3, HTTP: 5}, 16: {RM: 7}}


def test_a_threads_cpu_is_shared_by_its_samples_and_a_thread_without_python_is_openmp():
    spent = bench.split_threads({1: 0.8, 2: 0.3, 3: 0.5}, {1: {HTTP: 3, VALIDATION: 1}, 2: {HTTP: 2}})
    assert spent == pytest.approx({HTTP: 0.9, VALIDATION: 0.2, bench.OPENMP: 0.5})


def test_the_table_gives_cpu_ms_per_sample_and_shares_per_level():
    cpu = {1: {"a": 0.3, "b": 0.1}, 64: {"a": 0.2, "b": 0.2, "c": 0.0}}
    table = bench.breakdown_table(["b", "a", "c"], cpu, {1: 100, 64: 200}, {1: 50.0, 64: 400.0}).splitlines()
    assert table[0] == "| component | c=1: CPU-ms/sample | share | c=64: CPU-ms/sample | share |"
    assert table[2] == "| b | 1.000 | 25% | 1.000 | 50% |"
    assert table[3] == "| a | 3.000 | 75% | 1.000 | 50% |"
    assert table[4] == "| **total** | **4.000** | 100% | **2.000** | 100% |"  # "c" spent nothing: no row
    assert table[5].startswith("| samples/s (wall: machine shared) | 50.0 |")
