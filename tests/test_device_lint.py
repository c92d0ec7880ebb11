"""Device discipline, read from the source: the code that runs inside GPU actors makes no tensor without saying
where, and calls no raw torch.distributed collective.

On CPU every tensor lands on the one device, so `torch.ones(k)` beside CUDA logits passes every CPU test and crashes
the first GPU run; NCCL takes CUDA tensors only, which OpenRLHF's `strategy.all_reduce` / `all_gather` handle (they
move a CPU tensor to the device and back). This test makes both mistakes fail here. Flagged:
  - a factory (`torch.ones`, `torch.tensor`, ...) without `device=` (unless its result goes straight into `.to(...)`);
  - a legacy constructor (`torch.Tensor(...)`, `torch.LongTensor(...)`, ...), with or without `device=`: it makes a
    CPU tensor (it refuses a CUDA device), so it is always the mistake above;
  - `.cpu()` whose result stays a tensor: it is a tensor moved off the device, which crashes the moment it meets one
    still there; `.cpu().tolist()` / `.item()` / `.numpy()` leave torch and are not flagged;
  - a raw torch.distributed collective.
A CPU tensor that is meant (an accumulator read back with .tolist(), a tensor handed to the strategy) goes in ALLOWED
with its reason. What the lint leaves alone, and why, is in NOT_FLAGGED.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cooper_openrlhf"
GPU_SIDE = ("ray", "rm", "algo", "engines", "eval")  # the packages whose code runs inside GPU actors
FACTORIES = {"tensor", "as_tensor", "ones", "zeros", "full", "empty", "arange", "linspace", "eye", "rand", "randn",
             "randint", "randperm"}
# Legacy typed constructors: CPU tensors always (torch refuses them a CUDA device).
LEGACY_CONSTRUCTORS = {"Tensor", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor",
                       "IntTensor", "ShortTensor", "ByteTensor", "CharTensor", "BoolTensor"}
LEAVES_TORCH = {"tolist", "item", "numpy"}  # `.cpu().tolist()` and the like: no tensor left to mix
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
               "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "gather",
               "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv"}

# What the lint does not flag, and why.
NOT_FLAGGED = {
    "x.new_tensor / new_zeros / new_ones / new_full / new_empty (...)":
        "made on x's device (and with x's dtype) by definition: they follow the tensor they are asked of, as "
        "`device=x.device` does; a new_* on a CPU tensor is the finding of whatever made that tensor",
    "*_like(x) and .to(x) / .to(x.device)": "follow x's device by definition",
}

# (file under cooper_openrlhf/, enclosing function, torch call) -> why a CPU tensor is meant there.
ALLOWED = {
    ("algo/rewards.py", "rule_reward", "torch.tensor"):
        "rewards are attached to OpenRLHF's samples, which keep them on the CPU (experience_maker)",
    ("ray/rm_scoring.py", "rm_logits", "torch.tensor"):
        "the trainer actor holds no GPU; the RM ranks return their logits as Python floats",
    ("rm/pairwise_update.py", "_pass", "torch.zeros"):
        "a CPU accumulator of Python floats, reduced by strategy.all_reduce (which moves it to the device and back)",
    ("rm/pairwise_update.py", "_micro_loss", "torch.tensor"):
        "added to the CPU accumulator of _pass, from floats already read off the logits",
    ("rm/bce_train.py", "collate", "torch.tensor"):
        "a DataLoader collate builds CPU batches; rm_logits moves them to the model's device",
    ("rm/bce_train.py", "_mean_over_ranks", "torch.tensor"):
        "handed to strategy.all_reduce, which moves it to the collective's device and back",
    ("ray/reward_actor.py", "rank_weight_spread", ".cpu()"):
        "handed to strategy.all_gather, which moves it to the collective's device and back",
    ("rm/bce_train.py", "evaluate", ".cpu()"):
        "held-out logits gathered on the CPU, where collate's labels are, for the epoch's metrics",
    ("rm/export.py", "_gathered_state_dict", ".cpu()"):
        "the exported state dict is gathered on the CPU of rank 0 and saved from there",
}


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def findings(package: Path = PACKAGE) -> list[tuple[str, str, str, int]]:
    """(file, enclosing function, offending call, line) for every factory without a device and raw collective."""
    found = []
    for path in sorted(p for name in GPU_SIDE for p in (package / name).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        relative = str(path.relative_to(package))
        moved = set()  # factory calls whose result goes straight into .to(...)
        left_torch = set()  # .cpu() calls whose result goes straight into .tolist() / .item() / .numpy()
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Call)):
                if node.func.attr == "to":
                    moved.add(id(node.func.value))
                if node.func.attr in LEAVES_TORCH:
                    left_torch.add(id(node.func.value))

        def visit(node, function):
            for child in ast.iter_child_nodes(node):
                name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                if isinstance(child, ast.Call):
                    called = _dotted(child.func)
                    head, _, last = called.rpartition(".")
                    if head == "torch" and last in FACTORIES and id(child) not in moved:
                        if not any(k.arg == "device" for k in child.keywords):
                            found.append((relative, function, called, child.lineno))
                    if head == "torch" and last in LEGACY_CONSTRUCTORS:
                        found.append((relative, function, called, child.lineno))
                    if (isinstance(child.func, ast.Attribute) and child.func.attr == "cpu" and not child.args
                            and id(child) not in left_torch):
                        found.append((relative, function, ".cpu()", child.lineno))
                    if head in ("dist", "torch.distributed") and last in COLLECTIVES:
                        found.append((relative, function, called, child.lineno))
                visit(child, name)

        visit(tree, "<module>")
    return found


def test_gpu_side_code_makes_tensors_on_a_named_device_and_reduces_through_the_strategy():
    unexplained = [f"{file}:{line} in {function}: {call}" for file, function, call, line in findings()
                   if (file, function, call) not in ALLOWED]
    assert not unexplained, ("tensors made without device= (add device=, use *_like or .to(other)) or raw "
                             "torch.distributed collectives (use strategy.all_reduce / all_gather), or allow-list "
                             "them with a reason:\n  " + "\n  ".join(unexplained))


def test_every_allow_list_entry_still_matches_code_and_has_a_reason():
    present = {(file, function, call) for file, function, call, _ in findings()}
    assert set(ALLOWED) <= present, f"stale entries: {set(ALLOWED) - present}"
    assert all(len(reason) > 20 for reason in [*ALLOWED.values(), *NOT_FLAGGED.values()])


def test_the_lint_catches_the_defects_it_was_written_for(tmp_path):
    """The pair mask of the RM update (torch.ones without a device), a raw all_reduce, and a legacy
    constructor and a tensor moved to the CPU that meets one on the device are found; what follows a tensor's
    device (device=x.device, .to(x), x.new_*) and a .cpu() read back as Python values are not."""
    package = tmp_path / "cooper_openrlhf"
    (package / "ray").mkdir(parents=True)
    (package / "ray" / "x.py").write_text(
        "import torch\nimport torch.distributed as dist\n"
        "def loss(logits, k):\n    mask = torch.ones(k, dtype=torch.bool)\n    ok = torch.ones(k, device=logits.device)\n"
        "    moved = torch.tensor([1.0]).to(logits)\n    dist.all_reduce(mask)\n"
        "    weights = torch.Tensor([1.0, 2.0])\n    ids = torch.LongTensor([0, 1], device='cpu')\n"
        "    same = logits.new_zeros(k)\n    seen = logits.cpu().tolist()\n    return logits.cpu() * ok\n")
    for package_name in GPU_SIDE[1:]:
        (package / package_name).mkdir()
    assert [(f, fn, c) for f, fn, c, _ in findings(package)] == [
        ("ray/x.py", "loss", "torch.ones"), ("ray/x.py", "loss", "dist.all_reduce"),
        ("ray/x.py", "loss", "torch.Tensor"), ("ray/x.py", "loss", "torch.LongTensor"), ("ray/x.py", "loss", ".cpu()")]

