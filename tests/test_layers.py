"""The package's layers, bottom to top, written once: a module never imports from a layer above its own.

A lower layer that reaches up (the RM's training importing a CLI's argument helpers, figures importing the lab's
arm list) ties pieces together that should change apart and invites import cycles. This list is the one statement
of the order (README's package map lists the same folders). Lazy imports inside functions count too: they are
imports all the same.

The product (training, serving, launching, and their entry points) sits below the research harness: the run
reports, the reward-hacking lab and the commands that drive them (RESEARCH). The harness runs the product and reads
its runs; the product never imports the harness, so it ships and changes without it. The command-line entry points
live in one folder, cli/; the research ones (RESEARCH_CLIS) are placed in their own layer above the lab.
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
    "core",  # one Cooper step on plain data: rewards, pairs, metrics, the hacking response (ray and serve call it)
    "eval",  # benchmark evaluation
    "ray",  # the Cooper step on OpenRLHF's actors; reading a run's logs back
    "serve",  # the reward service: Cooper behind a trainer's reward URL
    "clients",  # reward functions for TRL and verl that call the service
    "cluster",  # launch support: the paper's arms and their argv, placement, the launchers' checks, run checks
    "cli",  # the product's entry points (train, serve, verifyrm, evaluate, preflight, gpu_smoke, ...)
    # the research harness, above the whole product
    "report",  # reading runs, figures, tables
    "lab",  # the reward-hacking lab
    "research cli",  # the entry points of the lab and the reports (RESEARCH_CLIS)
]
RESEARCH = ("report", "lab", "research cli")
# cli/ modules that drive the lab or read runs for reports: their layer is "research cli", not "cli".
RESEARCH_CLIS = ("batch", "blindspot", "demo", "lab", "probe_rm", "replay_monitor", "report", "rollouts")


def layer_of(module: str) -> str:
    """The layer of a dotted module path under the package ("cli.lab" -> "research cli", "ray.trainer" -> "ray")."""
    parts = module.split(".")
    return "research cli" if parts[0] == "cli" and len(parts) > 1 and parts[1] in RESEARCH_CLIS else parts[0]


def imported_layers(parts: tuple[str, ...], source: str) -> list[tuple[str, int]]:
    """(layer, line) of every import of a cooper_openrlhf layer (`layer_of` places it) in the module at `parts` (its
    path under the package, e.g. ("report", "replay.py")): absolute (`import cooper_openrlhf.x`,
    `from cooper_openrlhf.x import y`, `from cooper_openrlhf import x`) and relative (`from ..x import y`,
    `from .. import x`)."""
    package = ("cooper_openrlhf", *parts[:-1])  # the package the module's relative imports start from
    found = []
    for node in ast.walk(ast.parse(source)):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from .x import y` is package.x; each further dot goes one package up
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            # `from cooper_openrlhf import lab` (or `from .. import lab`) imports the subpackage named in the list, and
            # `from cooper_openrlhf.cli import lab` the entry point (whose layer depends on which one it is)
            named = base in ("cooper_openrlhf", "cooper_openrlhf.cli")
            modules = [f"{base}.{alias.name}" for alias in node.names] if named else [base]
        for name in modules:
            if name.startswith("cooper_openrlhf."):
                found.append((layer_of(name.removeprefix("cooper_openrlhf.")), node.lineno))
    return found


def imports_by_layer() -> list[tuple[str, str, str, int]]:
    """(importing file, its layer, imported layer, line) for every import of another cooper_openrlhf layer."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) < 2:
            continue  # the package's __init__
        layer = layer_of(".".join([*parts[:-1], path.stem]))
        for target, line in imported_layers(parts, path.read_text()):
            if target != layer and target in LAYERS:  # not the package's own names (`__version__`)
                found.append((str(path.relative_to(PACKAGE)), layer, target, line))
    return found


def test_the_scan_sees_every_form_of_import():
    """Relative imports and `from cooper_openrlhf import <layer>` reach up the layers as surely as absolute ones."""
    source = "\n".join([
        "import cooper_openrlhf.lab.runner",  # 1
        "from cooper_openrlhf.cli import lab",  # 2: a research entry point
        "from cooper_openrlhf import lab, __version__",  # 3
        "from .. import report",  # 4: from algo/sub/x.py, `..` is algo; from algo/x.py it is the package
        "from ..ray import trainer",  # 5: from algo/x.py the ray layer; from algo/sub/x.py algo.ray
        "from .hacking import HackingMonitor",  # 6: the module's own package
        "from cooper_openrlhf.cli import main, demo",  # 7: a product entry point, then a research one
        "from cooper_openrlhf.cli.gpu_smoke import STAGES",  # 8
        "def f():\n    from ...serve import app",  # 10: lazy, and three levels up
    ])
    assert imported_layers(("algo", "x.py"), source.replace("...serve", "..serve")) == [
        ("lab", 1), ("research cli", 2), ("lab", 3), ("__version__", 3), ("report", 4), ("ray", 5), ("algo", 6),
        ("cli", 7), ("research cli", 7), ("cli", 8), ("serve", 10)]
    assert imported_layers(("algo", "sub", "x.py"), source)[4:7] == [("algo", 4), ("algo", 5), ("algo", 6)]
    assert imported_layers(("algo", "sub", "x.py"), source)[-1] == ("serve", 10)
    # From inside cli/, `from . import lab` is the lab's entry point and `from .cooper_args import x` the product's.
    assert imported_layers(("cli", "x.py"), "from . import lab\nfrom .cooper_args import add") == [
        ("research cli", 1), ("cli", 2)]


def test_every_subpackage_has_a_place_in_the_layer_order():
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders = set(LAYERS) - {"research cli"}  # a layer of cli/'s modules, not a folder of its own
    assert subpackages == folders, f"unplaced: {subpackages - folders}, gone: {folders - subpackages}"
    missing = [name for name in RESEARCH_CLIS if not (PACKAGE / "cli" / f"{name}.py").is_file()]
    assert not missing, f"RESEARCH_CLIS names entry points cli/ no longer has: {missing}"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{file}:{line} ({layer} imports {target})" for file, layer, target, line in imports_by_layer()
              if LAYERS.index(target) > LAYERS.index(layer)]
    assert not upward, "imports that run back up the layers:\n  " + "\n  ".join(upward)


def test_the_product_imports_nothing_of_the_research_harness():
    """Stated apart from the order, so that moving a product layer above the lab cannot make it pass: launch
    support, the GPU smoke test and every other product module run without report/, lab/ and their commands."""
    assert LAYERS[-len(RESEARCH):] == list(RESEARCH)
    reaching = [f"{file}:{line} ({layer} imports {target})" for file, layer, target, line in imports_by_layer()
                if layer not in RESEARCH and target in RESEARCH]
    assert not reaching, "product modules that import the research harness:\n  " + "\n  ".join(reaching)
