"""One `ninja` for DeepSpeed's JIT-compiled ops, in every process of a run.

DeepSpeed builds its ops (CPU Adam, FusedAdam, the CPU accelerator's shm comm) on first use with torch's
`cpp_extension`, which runs whichever `ninja` comes first on PATH, in a build folder shared by every process
(`~/.cache/torch_extensions`). The `ninja` pip installs beside torch and the system's can be different versions,
and ninja 1.12 changed the hash it records for each build command: a process that finds the other version sees
every command as changed and rebuilds the op from scratch (minutes of C++ on a small machine), after which the
first kind of process rebuilds it again. Which one a process finds depends on how it was started (the venv's
bin on PATH in a shell, not in a Ray worker started by a bare `ray start`). So every Cooper process puts the
running interpreter's own folder first, where pip put the `ninja` that belongs to this torch.

A build holds a lock file in its op's folder (torch's `FileBaton`: created exclusively, its descriptor open until the
build ends, then removed). A process killed mid-build leaves it behind, and every later process that loads the op
waits on it forever: a run or a test that hangs at start-up with no error. `clear_stale_build_locks` removes a lock
that no process on this machine holds open and that is older than a build takes: on a home folder shared by
several nodes another node's build holds its lock where this node's /proc cannot see it.
"""

import logging
import os
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)


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


def extensions_root() -> Path:
    """Where torch builds JIT extensions: $TORCH_EXTENSIONS_DIR, else torch's default root."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def open_files() -> tuple[set[Path], bool]:
    """(every file some process holds open, whether every process's descriptors could be read). Linux /proc."""
    held, complete = set(), True
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                try:
                    held.add(Path(os.readlink(fd)))
                except OSError:  # closed between the listing and the read
                    pass
        except PermissionError:  # another user's process
            complete = False
        except (FileNotFoundError, ProcessLookupError):  # the process ended meanwhile
            pass
    return held, complete


def clear_stale_build_locks(root: Path | None = None, older_than_s: float = 600.0,
                            unknown_after_s: float = 3600.0) -> list[Path]:
    """Remove the build locks under `root` (an op's folder, one or two levels down: `<root>/<op>/lock` or
    `<root>/py311_cpu/<op>/lock`) that no process here holds open and that are older than `older_than_s` (an op
    builds in minutes); returns those removed. When some processes' descriptors cannot be read (another user's), only
    locks older than `unknown_after_s`."""
    root = extensions_root() if root is None else root
    locks = [*root.glob("*/lock"), *root.glob("*/*/lock")]
    if not locks:
        return []
    held, complete = open_files()
    removed = []
    for lock in locks:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:  # its build ended meanwhile
            continue
        if lock.resolve() in held or age < (older_than_s if complete else max(older_than_s, unknown_after_s)):
            continue
        try:
            lock.unlink()
        except FileNotFoundError:
            continue
        logger.warning("removed %s: a build lock no process holds (a build killed midway left it; every process "
                       "loading that op would wait on it forever)", lock)
        removed.append(lock)
    return removed


def ready_for_op_builds() -> None:
    """The interpreter's `ninja` first on PATH, and no lock a killed build left behind."""
    put_tools_first_on_path()
    clear_stale_build_locks()


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
