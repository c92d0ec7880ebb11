"""The package's layers, bottom to top, written once: a module never imports from a layer above its own.

A lower layer that reaches up (the RM's training importing a CLI's argument helpers, figures importing the lab's
arm list) ties pieces together that should change apart and invites import cycles. This list is the one statement
of the order (README's package map lists the same folders). Lazy imports inside functions count too: they are
imports all the same.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cooper_openrlhf"
LAYERS = [  # bottom to top; a module may import from its own layer and the ones before it
    "runtime",  # the CPU shims, dtype choice, Ray start-up and runtime env, OpenRLHF's argument interception
    "models",  # the small models the install materialises
    "data",  # benchmark loaders, synthetic problems
    "algo",  # pure math: template, losses, rewards, selection, the hacking rule and its statistics
    "engines",  # generation engines behind one interface
    "verify",  # answer extraction, the rule verifier and its pool, the LLM judge
    "rm",  # VerifyRM: model, BCE training, annotation, scoring
    "eval",  # benchmark evaluation
    "ray",  # the Cooper step on OpenRLHF's actors
    "serve",  # the reward service: Cooper behind a trainer's reward URL
    "clients",  # reward functions for TRL and verl that call the service
    "report",  # reading runs, figures, tables
    "lab",  # the reward-hacking lab
    "cluster",  # the launchers' pure checks (placement, variables, files)
    "cli",  # entry points
]


def imports_by_layer() -> list[tuple[str, str, str, int]]:
    """(importing file, its layer, imported layer, line) for every import of another cooper_openrlhf layer."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) < 2:
            continue  # the package's __init__
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cooper_openrlhf."):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("cooper_openrlhf.")]
            for name in names:
                target = name.split(".")[1]
                if target != parts[0]:
                    found.append((str(path.relative_to(PACKAGE)), parts[0], target, node.lineno))
    return found


def test_every_subpackage_has_a_place_in_the_layer_order():
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert subpackages == set(LAYERS), f"unplaced: {subpackages - set(LAYERS)}, gone: {set(LAYERS) - subpackages}"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{file}:{line} ({layer} imports {target})" for file, layer, target, line in imports_by_layer()
              if LAYERS.index(target) > LAYERS.index(layer)]
    assert not upward, "imports that run back up the layers:\n  " + "\n  ".join(upward)
