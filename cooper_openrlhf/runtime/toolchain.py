"""One `ninja` for DeepSpeed's JIT-compiled ops, in every process of a run.

DeepSpeed builds its ops (CPU Adam, FusedAdam, the CPU accelerator's shm comm) on first use with torch's
`cpp_extension`, which runs whichever `ninja` comes first on PATH, in a build folder shared by every process
(`~/.cache/torch_extensions`). The `ninja` pip installs beside torch and the system's can be different versions,
and ninja 1.12 changed the hash it records for each build command: a process that finds the other version sees
every command as changed and rebuilds the op from scratch (minutes of C++ on a small machine), after which the
first kind of process rebuilds it again. Which one a process finds depends on how it was started (the venv's
bin on PATH in a shell, not in a Ray worker started by a bare `ray start`). So every Cooper process puts the
running interpreter's own folder first, where pip put the `ninja` that belongs to this torch.
"""

import os
import sys
from pathlib import Path


def interpreter_tool_dir() -> Path | None:
    """The running interpreter's bin folder when it holds a `ninja` (a venv or conda env with pip's ninja)."""
    folder = Path(sys.executable).parent
    return folder if (folder / "ninja").is_file() else None


def path_with_tools_first(path: str, tools: Path | None) -> str:
    """`path` with `tools` first (moved there if it was further down); unchanged without `tools`."""
    if tools is None:
        return path
    rest = [entry for entry in path.split(os.pathsep) if entry and Path(entry) != tools]
    return os.pathsep.join([str(tools), *rest])


def put_tools_first_on_path(environ: dict | None = None) -> None:
    """Make this process (and what it starts) find the interpreter's `ninja` first."""
    environ = os.environ if environ is None else environ
    environ["PATH"] = path_with_tools_first(environ.get("PATH", ""), interpreter_tool_dir())


def worker_path_var() -> dict[str, str]:
    """The PATH entry of a Ray runtime env that does the same in every worker (Ray expands `${PATH}` there,
    ray/_private/utils.update_envs); empty when the interpreter has no `ninja` of its own."""
    tools = interpreter_tool_dir()
    return {} if tools is None else {"PATH": f"{tools}{os.pathsep}${{PATH}}"}


# DeepSpeed's ops a CPU run loads: OpenRLHF's FusedAdam and the CPU accelerator's shared-memory collectives.
CPU_OPS = ("FusedAdamBuilder", "ShareMemCommBuilder")


def build_deepspeed_cpu_ops() -> list[str]:
    """Build (or find built) DeepSpeed's CPU ops in torch's extension folder, with the interpreter's ninja: once at
    install, instead of inside the first run or test that needs them (minutes of C++ on a small machine)."""
    put_tools_first_on_path()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    built = []
    for name in CPU_OPS:
        builder = accelerator.create_op_builder(name)
        builder.load(verbose=False)
        built.append(builder.name)
    return built


if __name__ == "__main__":  # scripts/install.sh: python -m cooper_openrlhf.runtime.toolchain
    print("DeepSpeed CPU ops ready:", ", ".join(build_deepspeed_cpu_ops()))
