"""A pre-registered batch of labs: a plan frozen at a commit, run resumably, its finished runs published as they end.

The plan (JSON, docs/lab.md says why each entry) names the commit whose package the batch must run, a run folder,
and its labs in order, each a `cli.lab` argument list. `check_commit` refuses a worktree whose package differs from
the plan's commit (other code, or uncommitted edits under cooper_openrlhf/): a batch run from anything else would
not be the one registered. Each lab runs one seed at a time (`--seeds 1`, then 2, ...: `cli.lab` keeps finished
runs), and after each seed `publish_runs` copies every finished run's small logs (run_info.json, command.txt, the
gzipped run.log, tensorboard/ and samples/, no checkpoint) into an archive per run, with the lab's report and
lab.json, under the publish folder, and commits them there when asked. A lab that shares `prepared_from` another
gets that lab's task files, policy and starting-RM candidates (hard links; JSON records with the folder's path
rewritten), so it trains nothing the other trained and only chooses its own candidate (`--rm-choice`).

A plan may name an `environment` (variables the package reads, such as COOPER_CPU_BF16, which decides the CPU's
dtype): `apply_environment` sets them for every lab of the batch, and refuses a shell that set one otherwise, so
the dtype the plan registered is the one its runs compute in on any machine.

Resuming: the same command again. Runs left "done" are skipped; on a new machine the published archives are the
record, and each lab first unpacks the runs its folder lacks (`restore_missing_runs`), so only the runs that were in
flight are redone, and the preparation is redone from the same code and seeds. The
preparation is seeded torch on the CPU (no vLLM), so the same machine kind and dtype should give it byte for byte;
`preparation_fingerprint` hashes what the arms start from, published beside the runs, so that a resumed batch can
show it continued from the same starting models (`compare_fingerprints`) rather than assume it.
"""

import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tarfile
from pathlib import Path

logger = logging.getLogger(__name__)

PACKAGE = "cooper_openrlhf"
SMALL_PARTS = ("run_info.json", "command.txt", "tensorboard", "samples")  # what the report reads; no checkpoints


class PlanError(SystemExit):
    """A plan that cannot be run as registered (exit status 2, nothing run)."""

    def __init__(self, message: str):
        super().__init__(f"batch plan refused: {message}")


def load_plan(path: Path) -> dict:
    plan = {**json.loads(path.read_text(encoding="utf-8")), "path": str(path)}
    missing = [k for k in ("commit", "out", "labs") if k not in plan]
    if missing:
        raise PlanError(f"{path} lacks {missing}")
    names = [lab["name"] for lab in plan["labs"]]
    if len(set(names)) != len(names):
        raise PlanError(f"{path}: a lab is named twice in {names}")
    for lab in plan["labs"]:
        if lab.get("prepared_from") and lab["prepared_from"] not in names[:names.index(lab["name"])]:
            raise PlanError(f"lab {lab['name']!r} is prepared from {lab['prepared_from']!r}, not an earlier lab")
        if any(a in ("--out", "--seeds") for a in lab["args"]):
            raise PlanError(f"lab {lab['name']!r}: --out and --seeds come from the plan (out, seeds)")
    environment = plan.get("environment", {})
    if not isinstance(environment, dict) or not all(isinstance(v, str) for v in environment.values()):
        raise PlanError(f"{path}: environment must map variable names to strings, not {environment!r}")
    return plan


def apply_environment(plan: dict, environ=os.environ) -> dict[str, str]:
    """Set the plan's `environment` in `environ` (the labs' subprocesses inherit it); a variable the shell already
    set to another value is refused, not overridden: the runs would not compute as registered. Returns it."""
    environment = plan.get("environment", {})
    clashes = {k: environ[k] for k, v in environment.items() if k in environ and environ[k] != v}
    if clashes:
        raise PlanError(f"the plan sets {environment}, the shell has {clashes}: unset them or run another plan")
    environ.update(environment)
    if environment:
        logger.info("batch: environment %s (the plan's)", environment)
    return environment


def _git(repo: Path, *args: str, strip: bool = True) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise PlanError(f"git {' '.join(args)} in {repo} failed: {done.stderr.strip()}")
    return done.stdout.strip() if strip else done.stdout


def is_checkout_root(folder: Path) -> bool:
    """Whether `folder` is the root of a git checkout (not a folder inside one, such as a venv in a clone)."""
    try:
        return Path(_git(folder, "rev-parse", "--show-toplevel")).resolve() == folder.resolve()
    except (PlanError, OSError):
        return False


def package_checkout() -> Path | None:
    """The git checkout this package runs from, or None for an installed package (a wheel in site-packages has no
    repository around it). Its docs/ hold what the lab's commands read beside the package: the pre-registered plans
    (docs/lab/) and the committed verdicts (docs/results/). The commands ask this once and pass the folder on; the
    lab's modules take it as an argument and never guess it from where they are installed."""
    root = Path(__file__).resolve().parents[2]
    return root if is_checkout_root(root) else None


def package_commit(repo: Path) -> str | None:
    """The commit `repo`'s package was run from, with "+uncommitted" when files under it differ from that commit;
    None outside a git checkout (an installed wheel): what a lab.json records beside its numbers."""
    if not is_checkout_root(repo):
        return None
    try:
        head = _git(repo, "rev-parse", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no", "--", PACKAGE)
    except (PlanError, OSError):
        return None
    return head + ("+uncommitted" if dirty else "")


def check_commit(repo: Path, commit: str) -> None:
    """Raise PlanError unless `repo`'s package (tracked files under cooper_openrlhf/, as checked out, with no
    uncommitted change) is the package of `commit`."""
    wanted = _git(repo, "rev-parse", f"{commit}^{{commit}}:{PACKAGE}")
    here = _git(repo, "rev-parse", f"HEAD:{PACKAGE}")
    if here != wanted:
        head = _git(repo, "rev-parse", "--short", "HEAD")
        raise PlanError(f"the plan is frozen at {commit}, and the package in {repo} (HEAD {head}) is other code; "
                        f"run it from a worktree at that commit: git worktree add --detach <dir> {commit}")
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no", "--", PACKAGE)
    if dirty:
        raise PlanError(f"uncommitted changes under {PACKAGE}/ in {repo}:\n{dirty}")


PLANS_DIR = Path("docs") / "lab"  # the pre-registered batches' plans, one folder each (docs/lab/<batch>/plan.json)
PLAN_MARKER = "batch_plan.json"  # in each lab folder of a batch: the plan it belongs to and the plan's commit


def plan_of_folder(repo: Path | None, folder: Path) -> dict | None:
    """The plan a lab folder belongs to ({"commit", "lab", ...}), or None: the marker `run_batch` leaves in it, else a
    plan under `repo`/docs/lab/*/plan.json whose out/<lab> is `folder` (folders of batches run before the marker;
    repo None, an installed package: only the marker)."""
    marker = folder / PLAN_MARKER
    if marker.is_file():
        return json.loads(marker.read_text(encoding="utf-8"))
    for path in sorted((repo / PLANS_DIR).glob("*/plan.json") if repo else ()):
        try:
            plan = json.loads(path.read_text(encoding="utf-8"))
            labs = [(Path(plan["out"]) / lab["name"], lab["name"]) for lab in plan["labs"]]
        except (ValueError, KeyError, TypeError):
            continue
        for lab_folder, name in labs:
            if lab_folder.resolve() == folder.resolve():
                return {"plan": str(path), "commit": plan["commit"], "lab": name}
    return None


def check_folder_commit(repo: Path | None, folder: Path) -> None:
    """Raise PlanError when `folder` is a lab of a pre-registered plan and `repo`'s package is not the plan's commit:
    a run started by hand (`cli.lab --out` a batch's folder) must be the registered configuration too. repo None
    (an installed package, `package_checkout`): such a folder is refused, no commit can be shown."""
    owner = plan_of_folder(repo, folder)
    if owner is not None:
        try:
            if repo is None:
                raise PlanError(f"the package runs from no git checkout, so it cannot be shown to be the plan's commit "
                                f"{owner['commit']}: run it from a worktree at that commit")
            check_commit(repo, owner["commit"])
        except PlanError as exc:
            raise PlanError(f"{folder} is lab {owner.get('lab')!r} of the plan {owner.get('plan', '')} "
                            f"({exc.code.removeprefix('batch plan refused: ')})") from None


def share_preparation(source: Path, target: Path) -> None:
    """`source` lab's data/, policy/ and verifyrm/ into `target` (once): files hard-linked, JSON records copied with
    `source`'s path rewritten to `target`'s (the pair stage's cached probes name their RM by path)."""
    if (target / "verifyrm").exists():
        return
    for part in ("data", "policy", "verifyrm"):
        for path in sorted((source / part).rglob("*")):
            if path.is_dir() or "offline_continuation" in path.relative_to(source).parts[1:2]:
                continue
            if path.name in ("chosen.json", "offline_continuation.json", "probe.json") and part == "verifyrm" \
                    and path.parent in (source / "verifyrm", source / "verifyrm" / "pairs"):
                continue  # the choice and what follows from it are the target's own
            dest = target / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".json":
                dest.write_text(path.read_text(encoding="utf-8").replace(str(source), str(target)), encoding="utf-8")
            else:
                dest.hardlink_to(path)


def archive_run(run: Path, archive: Path) -> None:
    """The run's small logs (SMALL_PARTS and run.log) as one .tar.gz, paths relative to the run's lab folder."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for part in (*SMALL_PARTS, "run.log"):
            if (run / part).exists():
                tar.add(run / part, arcname=f"runs/{run.name}/{part}")
    tmp.replace(archive)


def archived_status(archive: Path) -> str | None:
    """The status in a run archive's run_info.json, or None when the archive is missing or holds none."""
    if not archive.is_file():
        return None
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.name.endswith("/run_info.json") and (handle := tar.extractfile(member)) is not None:
                return json.loads(handle.read().decode("utf-8")).get("status")
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _machine() -> str:
    """The CPU (family and model, as /proc/cpuinfo names them) and the dtype `auto` picks on it: what the bytes of a
    CPU training run depend on."""
    from cooper_openrlhf.runtime.dtype import fast_dtype_name

    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return (f"{fields.get('model name', platform.machine())} family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}, auto dtype {fast_dtype_name(cuda=False)}")


def preparation_fingerprint(lab: Path) -> dict:
    """sha256 of what every arm of `lab` starts from: the task files (data/*.jsonl), the warm-started policy and
    every VerifyRM weight file under verifyrm/ (the BCE stage's, each pair-stage candidate's, the offline
    continuation's), with the machine it was made on. Paths are relative to `lab`."""
    files = sorted([*(lab / "data").glob("*.jsonl"), *(lab / "policy").glob("*.safetensors"),
                    *(lab / "verifyrm").rglob("*.safetensors")])
    if not files:
        raise FileNotFoundError(f"{lab} holds no prepared data, policy or VerifyRM: nothing to fingerprint")
    return {"machine": _machine(), "files": {str(f.relative_to(lab)): _sha256(f) for f in files}}


def compare_fingerprints(published: dict, here: dict) -> list[str]:
    """The files both fingerprints hold with different bytes, one line each; [] when every shared file is the same.
    Files only one side holds are not differences (a preparation cut off before its last candidate, or the
    offline-pairs files of seeds not run yet); `one_sided` counts them."""
    old, new = published["files"], here["files"]
    lines = [f"{name}: different" for name in sorted(set(old) & set(new)) if old[name] != new[name]]
    if lines and published.get("machine") != here.get("machine"):
        lines.append(f"(made on {published.get('machine')}; this machine is {here.get('machine')})")
    return lines


def one_sided(published: dict, here: dict) -> tuple[int, int]:
    """How many files only the published fingerprint holds, and how many only this one."""
    old, new = set(published["files"]), set(here["files"])
    return len(old - new), len(new - old)


def restore_missing_runs(archives: Path, lab: Path) -> list[str]:
    """Unpack each published run archive (`archives`/*.tar.gz) whose run `lab` lacks, as a resume on a new machine
    does; a run this machine holds is its newer record and stays. The published lab.json beside `archives` comes
    too where `lab` has none: it records the invocations that ran the runs, which a re-report keeps. Returns the
    runs restored."""
    record = archives.parent / "lab.json"
    if record.is_file() and not (lab / "lab.json").exists():
        lab.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record, lab / "lab.json")
    restored = []
    for archive in sorted(archives.glob("*.tar.gz")):
        name = archive.name.removesuffix(".tar.gz")
        if not (lab / "runs" / name / "run_info.json").is_file():
            with tarfile.open(archive) as tar:
                tar.extractall(lab, filter="data")
            restored.append(name)
    return restored


def lab_arms(args: list[str]) -> tuple[str, ...]:
    """The arms a lab's `cli.lab` arguments run: --arms, else its preset's."""
    if "--arms" in args:
        return tuple(args[args.index("--arms") + 1].split(","))
    from cooper_openrlhf.lab.presets import PRESETS

    return PRESETS[args[args.index("--preset") + 1] if "--preset" in args else "quick"].arms


def unfinished_labs(plan: dict, published: Path) -> list[str]:
    """The plan's labs, in order, with fewer runs published "done" under `published`/<lab>/runs than arms x seeds."""
    def done(lab: dict) -> int:
        return sum(archived_status(a) == "done" for a in (published / lab["name"] / "runs").glob("*.tar.gz"))

    return [lab["name"] for lab in plan["labs"] if done(lab) < len(lab_arms(lab["args"])) * lab["seeds"]]


def unpack_published(published: Path, labs: list[str], dest: Path) -> Path:
    """Lay out a published batch (`published/<lab>/lab.json` and `runs/*.tar.gz`, as `publish_runs` writes them) as
    the plan's out folder under `dest`, so the reading tools (the plan's test, the blind-spot figure, the report)
    work from a clone that never ran the batch; returns `dest`. A lab not published yet is left out."""
    for name in labs:
        source = published / name
        if (source / "lab.json").is_file():
            restore_missing_runs(source / "runs", dest / name)
    return dest


def publish_runs(lab: Path, dest: Path) -> list[Path]:
    """Archive each finished ("done" or "failed") run of `lab` whose archive is missing or holds another status (a
    failed run the lab retried since: the retry replaces it, else a resume from the archives would restore the
    failure), and copy lab.json and the report (report/publish.py) into `dest`; returns the files written."""
    from cooper_openrlhf.lab.runner import read_info
    from cooper_openrlhf.report.publish import publish_report

    written = []
    for info_path in sorted((lab / "runs").glob("*/run_info.json")):
        run = info_path.parent
        archive = dest / "runs" / f"{run.name}.tar.gz"
        status = read_info(run).get("status")
        if status in ("done", "failed") and archived_status(archive) != status:
            archive_run(run, archive)
            written.append(archive)
    if (lab / "report" / "report.md").is_file() and (lab / "lab.json").is_file():
        written += publish_report(lab / "report", dest, root=lab, extra=[lab / "lab.json"])
    return written


def uncommitted(repo: Path, folder: Path) -> list[Path]:
    """Files under `folder` that git sees as new or changed: what a batch stopped between publishing and committing
    left behind, which its resume (`publish_runs` archives a run once) would never offer again."""
    # -z and unstripped: entries "XY path" as git wrote them (a changed file's X is a space, which a strip would take
    # from the first entry) and paths unquoted. The NUL-separated field after a rename's entry is its old path.
    status = _git(repo, "status", "--porcelain", "-z", "--untracked-files=all", "--",
                  str(folder.resolve().relative_to(repo.resolve())), strip=False)
    fields, paths = iter(status.split("\0")), []
    for entry in fields:
        if entry:
            paths.append(repo / entry[3:])
            if entry[0] in "RC":
                next(fields, None)
    return sorted(paths)


def commit_published(repo: Path, paths: list[Path], message: str) -> bool:
    """Commit `paths` (under `repo`) and nothing else (`git commit --only`); False when there was nothing to commit or
    git refused (another git command holding the lock: the next seed's commit takes them)."""
    if not paths:
        return False
    rel = [str(p.resolve().relative_to(repo.resolve())) for p in paths]
    add = subprocess.run(["git", "-C", str(repo), "add", "--", *rel], capture_output=True, text=True)
    done = subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message, "--only", "--", *rel],
                          capture_output=True, text=True) if add.returncode == 0 else add
    if done.returncode != 0:
        logger.warning("could not commit the published runs (%s); they stay in %s", done.stderr.strip(), repo)
    return done.returncode == 0


def run_batch(plan: dict, repo: Path, run_lab, publish: Path | None = None, commit_to: Path | None = None,
              parallel_runs: int | None = None) -> int:
    """Every lab of the plan, seed by seed (module docstring); returns the number of failed runs. run_lab: the lab's
    entry point (`cli.lab.main`: argv -> exit status), passed in by the CLI that drives the batch. parallel_runs:
    how many of a seed's runs at once (`cli.lab --parallel-runs`), an execution option outside the plan: each run
    still has its own processes, seed and threads, so it computes what it would alone, only slower."""
    check_commit(repo, plan["commit"])
    apply_environment(plan)
    out = Path(plan["out"])
    failed = 0
    for lab in plan["labs"]:
        folder = out / lab["name"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / PLAN_MARKER).write_text(json.dumps({"plan": plan.get("path", ""), "commit": plan["commit"],
                                                      "lab": lab["name"]}, indent=2) + "\n", encoding="utf-8")
        if lab.get("prepared_from"):
            share_preparation(out / lab["prepared_from"], folder)
        if publish is not None and (restored := restore_missing_runs(publish / lab["name"] / "runs", folder)):
            logger.info("batch: lab %s, %d published runs restored (%s)", lab["name"], len(restored), folder)
        for seeds in range(1, lab["seeds"] + 1):
            logger.info("batch: lab %s, seeds 0..%d", lab["name"], seeds - 1)
            status = run_lab([*lab["args"], "--seeds", str(seeds), "--out", str(folder),
                              *(["--parallel-runs", str(parallel_runs)] if parallel_runs else [])])
            failed += status != 0
            if publish is not None:
                publish_runs(folder, publish / lab["name"])
                if commit_to is not None:  # with whatever an earlier, stopped invocation published and did not commit
                    runs = len(list((folder / "runs").glob("*/run_info.json")))
                    name = plan.get("batch", plan.get("issue", ""))  # older plans named no batch, only their issue
                    commit_published(commit_to, uncommitted(commit_to, publish / lab["name"]),
                                     f"batch{name}: {lab['name']} after seed {seeds - 1} ({runs} runs)")
    return failed
