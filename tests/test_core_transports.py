"""The trainer and the reward service are transports of the Cooper core: neither runs the pair pipeline or shapes a
reward itself. Read from the source (the AST), so a call that slips past the core fails here whatever runs."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cooper_openrlhf"
REPLICATED = ["serve/replicated/ingress.py", "serve/replicated/registry.py", "serve/replicated/learner_actor.py",
              "serve/replicated/scoring.py"]
TRANSPORTS = ["ray/trainer.py", "ray/rm_scoring.py", "ray/evaluation.py", "serve/learner.py", "serve/service.py",
              "serve/probing.py", *REPLICATED]
# What only the core may call: the pair pipeline (algo/selection, PairBuilder's serial path) and the reward forms.
CORE_ONLY_MODULES = {"cooper_openrlhf.algo.selection", "cooper_openrlhf.algo.rewards"}
CORE_ONLY_NAMES = {"PairBuilder", "plan_negatives", "select_positives", "select_rollout_negatives", "assemble_pairs",
                   "assistant_prompts", "continuous_reward", "discrete_reward", "rule_reward",
                   "gate_answerless", "get_reward_form", "REWARD_FORMS", "rewards_of"}
CORE_ONLY_ATTRIBUTES = {"build_pairs", "plan_negatives", "finish_pairs", "reward_form"}  # on anything but the core


def reaches_past_the_core(source: str) -> list[str]:
    """What a module reaches of the core's insides: imports of CORE_ONLY_MODULES, uses of CORE_ONLY_NAMES, and
    calls of CORE_ONLY_ATTRIBUTES on any object (the core's own functions are imported by name, not called as
    attributes)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in CORE_ONLY_MODULES or f"{node.module}.{node.names[0].name}" in CORE_ONLY_MODULES:
                found.append(f"line {node.lineno}: from {node.module} import ...")
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in CORE_ONLY_NAMES]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name in CORE_ONLY_MODULES]
        elif isinstance(node, ast.Name) and node.id in CORE_ONLY_NAMES:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in CORE_ONLY_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.func.attr}(...)")
    return found


def test_the_scan_sees_a_transport_reaching_past_the_core():
    # lines 1-4 reach past the core; 5-6 call the core's own functions, which is what a transport does
    source = """from cooper_openrlhf.algo import selection
from cooper_openrlhf.algo.rewards import rule_reward
pairs = builder.build_pairs(q, r, c, v, 2)
plan = selection.plan_negatives(v, w, a, 2, 'rollout')
from cooper_openrlhf.core import finish_pairs, rewards
pairs = finish_pairs(config, plan, texts, {}, None, 0)"""
    assert reaches_past_the_core(source) == [
        "line 1: from cooper_openrlhf.algo import ...", "line 2: from cooper_openrlhf.algo.rewards import ...",
        "line 2: imports rule_reward", "line 3: .build_pairs(...)", "line 4: .plan_negatives(...)"]


@pytest.mark.parametrize("module", TRANSPORTS)
def test_a_transport_calls_the_core_not_the_pipeline_or_a_reward_form(module):
    assert reaches_past_the_core((PACKAGE / module).read_text()) == []


@pytest.mark.parametrize("module", ["ray/trainer.py", "serve/learner.py", "serve/service.py",
                                    "serve/replicated/ingress.py", "serve/replicated/learner_actor.py"])
def test_both_transports_call_the_core(module):
    imported = {node.module for node in ast.walk(ast.parse((PACKAGE / module).read_text()))
                if isinstance(node, ast.ImportFrom) and node.module}
    assert any(name == "cooper_openrlhf.core" or name.startswith("cooper_openrlhf.core.") for name in imported)


# The service's two hosts and the contract the HTTP app calls (serve/contract.py): its coroutines are coroutines in
# both, so the app awaits them alike.
HOSTS = {"serve/service.py": "RewardService", "serve/replicated/ingress.py": "RemoteService"}


def coroutines_of(source: str, name: str) -> dict[str, bool]:
    """{method: whether it is `async def`} of class `name` in `source`."""
    cls = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == name)
    return {f.name: isinstance(f, ast.AsyncFunctionDef) for f in cls.body
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.mark.parametrize("module", HOSTS)
def test_both_hosts_keep_the_contract_the_app_calls(module):
    contract = coroutines_of((PACKAGE / "serve/contract.py").read_text(), "RewardHost")
    assert {name for name, is_async in contract.items() if is_async} == {"start", "stop", "score", "gauges"}
    host = coroutines_of((PACKAGE / module).read_text(), HOSTS[module])
    for name, is_async in contract.items():
        if is_async:
            assert host.get(name) is True, f"{HOSTS[module]}.{name} is not a coroutine of its own"


def test_the_replicated_service_stands_beside_the_one_process_service():
    """It imports what both hosts share, never serve/service.py's host."""
    for module in REPLICATED:
        imported = {node.module for node in ast.walk(ast.parse((PACKAGE / module).read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module}
        assert "cooper_openrlhf.serve.service" not in imported, module
