"""Where a request's CPU goes in the reward service: CPU-ms per sample, per component, at concurrency 1 and 64.

    python benchmarks/serve_cpu_breakdown.py [--rm PATH] [--requests 512] [--concurrency 1,64]
        [--services one,replicated]

Each service is started alone (learning off) with `serve_throughput.py`'s `start_server`, warmed up, and driven by
its `run_load` on its stream of single-sample requests (`make_stream`; fresh prompts per level); at each level the
service's CPU is read from the kernel's counters (psutil) before and after the stream:
  one         `cooper serve`, one process. Each thread's CPU is split over components by py-spy sampling the
              process from outside during the stream (`py-spy record --threads --nonblocking`, active samples
              only): a thread's CPU is shared out in proportion to its samples, each sample's component being the
              first frame from the innermost out that matches `STACK_RULES`. Threads that py-spy never sees in
              Python are the forward's OpenMP pool (`OPENMP`). The rule verifier's worker processes (children)
              make their own row.
  replicated  `cooper serve --replicas 1` (Ray Serve): every process of its tree (the driver, Ray's raylet and
              GCS, Serve's controller and proxy, the ingress, the registry, the scoring replica and the verifier
              worker under it), named by its process title (`PROCESS_RULES`).
Prints per service: component, CPU-ms per sample at each level and its share of the service's total, the total,
samples/s, and the client's CPU per sample (the load generator, this process, which shares the machine).

CPU time is counted by the kernel per thread and per process, so the CPU-ms hold on a machine shared with other
work (the run reads only the service's own processes); samples/s is wall time and does not: on a busy machine it
reads low. The split inside the one process is a sample (py-spy counts a thread that is runnable but waiting for a
core as active, which a busy machine adds to every component of that thread alike); py-spy runs outside the
service and is not counted, though it takes some CPU from the same cores (`pip install py-spy`). A process that
starts during a stream counts from its start; one that ends during it is not counted.
"""

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

SAMPLE_RATE = 250  # py-spy's samples a second
OPENMP = "RM forward (threads without Python: OpenMP)"
WORKERS = "verification (math-verify worker processes)"
OTHER = "other"

# (component, path fragment of the frame's file, function name or None for any): the first frame from the innermost
# out that matches a rule names the component; rules are tried in order on each frame.
STACK_RULES = (
    ("RM forward (scorer: tokenize, forward)", "cooper_openrlhf/rm/", None),
    ("verification (lanes in process)", "cooper_openrlhf/serve/verification.py", None),
    ("verification (lanes in process)", "cooper_openrlhf/verify/", None),
    ("HTTP and event loop (uvicorn, ASGI app)", "cooper_openrlhf/serve/protocol.py", "build_response"),
    ("request validation (decode, parse, check, split)", "cooper_openrlhf/serve/protocol.py", None),
    ("request validation (decode, parse, check, split)", "cooper_openrlhf/serve/validation.py", None),
    ("request validation (decode, parse, check, split)", "cooper_openrlhf/serve/app.py", "samples_of"),
    ("request validation (decode, parse, check, split)", "cooper_openrlhf/serve/app.py", "decode_json"),
    ("HTTP and event loop (uvicorn, ASGI app)", "cooper_openrlhf/serve/app.py", None),
    ("HTTP and event loop (uvicorn, ASGI app)", "cooper_openrlhf/serve/admission.py", None),
    ("batcher", "cooper_openrlhf/serve/batcher.py", None),
    ("service (groups, rewards, answers)", "cooper_openrlhf/serve/", None),
    ("service (groups, rewards, answers)", "cooper_openrlhf/core/", None),
    ("service (groups, rewards, answers)", "cooper_openrlhf/algo/", None),
    ("HTTP and event loop (uvicorn, ASGI app)", "uvicorn/", None),
)
ONE_PROCESS_ROWS = tuple(dict.fromkeys([c for c, _, _ in STACK_RULES] + [OPENMP, WORKERS, OTHER]))

# (component, text in the process title): Ray titles its workers `ray::<actor class>` (Serve's replicas
# `ray::ServeReplica:<app>:<deployment>`); the first rule the process's own title matches wins.
SCORER_TITLE = "ServeReplica:cooper-serve:Scorer"
PROCESS_RULES = (
    ("Serve proxy", "ray::ProxyActor"),
    ("ingress (serve/app.py on Serve)", "ServeReplica:cooper-serve:Ingress"),
    ("registry (actor)", "ray::GroupRegistry"),
    ("scorer (replica: RM forward, batching)", SCORER_TITLE),
    ("Serve controller", "ray::ServeController"),
    ("Ray core (raylet, GCS, agents)", "raylet"),
    ("Ray core (raylet, GCS, agents)", "ray::DashboardAgent"),
    ("idle Ray workers", "ray::IDLE"),
    ("Ray core (raylet, GCS, agents)", "gcs_server"),
    ("Ray core (raylet, GCS, agents)", "site-packages/ray/"),  # its Python daemons: log monitor, agents
    ("driver (cli.serve)", "cooper_openrlhf.cli.serve"),
)
VERIFIER_POOL = "verifier pool (math-verify worker processes)"
REPLICATED_ROWS = tuple(dict.fromkeys([c for c, _ in PROCESS_RULES[:4]] + [VERIFIER_POOL]
                                      + [c for c, _ in PROCESS_RULES[4:]] + [OTHER]))


# ------------------------------------------------------------------------------------------------- pure parts
def component_of_frames(frames: Sequence[tuple[str, str]]) -> str:
    """The component of a thread's stack, `frames` innermost first as (file name, function name, qualified or not):
    the first frame that matches a rule of `STACK_RULES` names it; `OTHER` when none does."""
    for filename, function in frames:
        filename = filename.replace(os.sep, "/")
        for component, fragment, name in STACK_RULES:
            if fragment in filename and (name is None or function == name or function.endswith("." + name)):
                return component
    return OTHER


def component_of_process(title: str, ancestor_titles: Sequence[str]) -> str:
    """The replicated service's component of a process, by its title (`PROCESS_RULES`); a process under the scoring
    replica is its verifier pool's (the pool's forkserver and its worker, whose command line names Ray's paths)."""
    if SCORER_TITLE not in title and any(SCORER_TITLE in t for t in ancestor_titles):
        return VERIFIER_POOL
    for component, marker in PROCESS_RULES:
        if marker in title:
            return component
    return OTHER


def cpu_delta(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per component between two readings of {key: (component, CPU seconds so far)}, a key per process
    (its pid) or per part of one: a key new in `after` counts from its start; one gone from `after` is not
    counted."""
    spent: dict[str, float] = {}
    for key, (component, seconds) in after.items():
        previous = before.get(key)
        used = seconds - (previous[1] if previous is not None and previous[0] == component else 0.0)
        spent[component] = spent.get(component, 0.0) + max(used, 0.0)
    return spent


def parse_py_spy_raw(lines: Sequence[str]) -> dict[int, dict[str, int]]:
    """{native thread id: {component: samples}} of `py-spy record --threads -f raw` output: one line per distinct
    stack, `thread (TID): NAME;FUNCTION (FILE:LINE);... COUNT`, outermost frame first."""
    samples: dict[int, dict[str, int]] = {}
    for line in lines:
        stack, _, count = line.strip().rpartition(" ")
        label, *frames = stack.split(";")
        thread = re.match(r"thread \((0x[0-9a-fA-F]+|\d+)\)", label)
        if thread is None or not count.isdigit():
            continue
        parsed = [(found.group(2), found.group(1)) for found in
                  (re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame) for frame in reversed(frames)) if found]
        per_thread = samples.setdefault(int(thread.group(1), 0), {})
        component = component_of_frames(parsed)
        per_thread[component] = per_thread.get(component, 0) + int(count)
    return samples


def split_threads(cpu_s: dict[int, float], samples: dict[int, dict[str, int]]) -> dict[str, float]:
    """CPU seconds per component: each thread's CPU (`cpu_s`, by native id) shared out in proportion to its samples'
    components; a thread with CPU and no sample ran no Python (the forward's OpenMP pool): `OPENMP`."""
    spent: dict[str, float] = {}
    for thread, seconds in cpu_s.items():
        counts = samples.get(thread) or {OPENMP: 1}
        total = sum(counts.values())
        for component, count in counts.items():
            spent[component] = spent.get(component, 0.0) + seconds * count / total
    return spent


def breakdown_table(rows: Sequence[str], cpu_s: dict[int, dict[str, float]], samples: dict[int, int],
                    rates: dict[int, float]) -> str:
    """A markdown table: per component (in the order of `rows`, then any others), CPU-ms per sample and its share
    of the level's total at each level; then the total and samples/s. cpu_s: level -> component -> CPU seconds
    over `samples[level]` samples; rates: level -> samples/s."""
    levels = list(cpu_s)
    names = list(dict.fromkeys([*rows, *(c for level in levels for c in cpu_s[level])]))
    totals = {level: sum(cpu_s[level].values()) for level in levels}
    head = "| component | " + " | ".join(f"c={level}: CPU-ms/sample | share" for level in levels) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(levels)]
    for name in names:
        if not any(cpu_s[level].get(name, 0.0) > 0 for level in levels):
            continue
        cells = []
        for level in levels:
            seconds = cpu_s[level].get(name, 0.0)
            share = seconds / totals[level] if totals[level] > 0 else 0.0
            cells.append(f"{1000 * seconds / samples[level]:.3f} | {100 * share:.0f}%")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{1000 * totals[level] / samples[level]:.3f}** | 100%"
                                                for level in levels) + " |")
    lines.append("| samples/s (wall: machine shared) | " + " | ".join(f"{rates[level]:.1f} | " for level in levels)
                 + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ readings of a run
def tree_cpu(root_pid: int, classify) -> dict[int, tuple[str, float]]:
    """{pid: (component, CPU seconds so far)} of `root_pid` and its descendants; classify(process, ancestors)."""
    import psutil

    reading = {}
    root = psutil.Process(root_pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            reading[process.pid] = (classify(process, process.parents()), times.user + times.system)
        except psutil.Error:  # ended meanwhile
            continue
    return reading


def title(process) -> str:
    return " ".join(process.cmdline())


def replicated_reading(pid: int, titles: dict[int, str] | None = None) -> dict[int, tuple[str, float]]:
    """`tree_cpu` of the replicated service by `component_of_process`; `titles`, when given, gets each pid's title."""
    def classify(process, ancestors) -> str:
        if titles is not None:
            titles[process.pid] = title(process)
        return component_of_process(title(process), [title(a) for a in ancestors])

    return tree_cpu(pid, classify)


def thread_cpu(pid: int) -> dict[int, float]:
    """{native thread id: CPU seconds so far} of the process's threads."""
    import psutil

    return {thread.id: thread.user_time + thread.system_time for thread in psutil.Process(pid).threads()}


def one_process_stream(pid: int, run, spy_out: str) -> dict[str, float]:
    """CPU seconds per component of the one-process service while `run()` drives it (module docstring); py-spy's
    samples go to `spy_out`."""
    spy_bin = os.path.join(os.path.dirname(sys.executable), "py-spy")
    spy = subprocess.Popen([spy_bin if os.path.exists(spy_bin) else "py-spy", "record", "-p", str(pid), "--threads",
                            "--nonblocking", "-r", str(SAMPLE_RATE), "-f", "raw", "-o", spy_out],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(2.0)  # py-spy attaches
    if spy.poll() is not None:
        raise RuntimeError(f"py-spy did not start (pip install -e '.[bench]'): {spy.stderr.read().decode()[-2000:]}")
    children = lambda: {k: v for k, v in tree_cpu(pid, lambda p, _: WORKERS).items() if k != pid}  # noqa: E731
    threads_before, children_before = thread_cpu(pid), children()
    run()
    threads_after, children_after = thread_cpu(pid), children()
    spy.send_signal(signal.SIGINT)
    spy.wait(120)
    with open(spy_out) as f:
        samples = parse_py_spy_raw(f.readlines())
    used = {tid: seconds - threads_before.get(tid, 0.0) for tid, seconds in threads_after.items()}
    spent = split_threads({tid: seconds for tid, seconds in used.items() if seconds > 0}, samples)
    for component, seconds in cpu_delta(children_before, children_after).items():
        spent[component] = spent.get(component, 0.0) + seconds
    return spent


def measure(args, kind: str, levels: list[int], workdir: str) -> None:
    """Start `kind` (serve_throughput's names: cooper, replicas1), read its CPU at each level, print the table."""
    import serve_throughput as st

    port = st.free_port()
    process = st.start_server(kind, args, port, workdir)
    url = f"http://127.0.0.1:{port}/get_reward"
    cpu_s, samples, rates, client = {}, {}, {}, {}
    titles, per_process = {}, {}  # the replicated service's processes: pid -> title; level -> pid -> CPU seconds
    try:
        st.wait_up(url, process, process.log)
        asyncio.run(st.run_load(url, st.make_stream(args.policy, 64, args.group_size, offset=10_000), 16))  # warm-up
        for level in levels:
            stream = st.make_stream(args.policy, args.requests, args.group_size, offset=1000 * level)
            st.wait_quiet([process])
            timed = {}

            def run():
                started = time.process_time()
                timed["rate"], _ = asyncio.run(st.run_load(url, stream, level))
                timed["client"] = time.process_time() - started

            if kind == "cooper":
                cpu_s[level] = one_process_stream(process.pid, run, os.path.join(
                    args.keep_profiles or workdir, f"py-spy-c{level}.txt"))
            else:
                before = replicated_reading(process.pid)
                run()
                after = replicated_reading(process.pid, titles)
                cpu_s[level] = cpu_delta(before, after)
                per_process[level] = {pid: (component, seconds - before.get(pid, ("", 0.0))[1])
                                      for pid, (component, seconds) in after.items()}
            rates[level], client[level], samples[level] = timed["rate"], timed["client"], len(stream)
    finally:
        process.terminate()
        process.wait(120)
    name = "one process (`cooper serve`)" if kind == "cooper" else "replicated (`cooper serve --replicas 1`)"
    print(f"\n== {name}: RM {args.rm}, {args.dtype}; {args.requests} single-sample requests per level; "
          f"{os.cpu_count()} CPUs\n", flush=True)
    print(breakdown_table(ONE_PROCESS_ROWS if kind == "cooper" else REPLICATED_ROWS, cpu_s, samples, rates))
    print("\nclient (aiohttp, this process): " + ", ".join(
        f"{1000 * client[level] / samples[level]:.3f} CPU-ms/sample at c={level}" for level in levels), flush=True)
    for pid, name in titles.items():  # how each process was read, to check the attribution
        read = [per_process[level].get(pid, (OTHER, 0.0)) for level in levels]
        if any(seconds * 1000 / samples[level] >= 0.005 for level, (_, seconds) in zip(levels, read)):
            print(f"  pid {pid}: " + ", ".join(f"{1000 * seconds / samples[level]:.3f}" for level, (_, seconds)
                                               in zip(levels, read)) + f" CPU-ms/sample: {read[-1][0]}; {name[:90]}")


def main() -> None:
    from cooper_openrlhf.models import model_path
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rm", default=None, help="RM folder (default: the tiny Qwen2 RM; a MiniLM VerifyRM folder as "
                                              "serve_throughput.py makes it works too)")
    p.add_argument("--policy", default=None, help="policy tokenizer folder (default: the tiny Qwen2 policy)")
    p.add_argument("--requests", type=int, default=512, help="single-sample requests per level")
    p.add_argument("--concurrency", default="1,64")
    p.add_argument("--services", default="one,replicated", help="one (cooper serve), replicated (--replicas 1)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--keep-profiles", default=None, metavar="DIR",
                   help="keep py-spy's samples of the one process here (py-spy-cLEVEL.txt, raw stacks)")
    args = p.parse_args()
    args.rm = args.rm or model_path("tiny-qwen2-rm")
    args.policy = args.policy or model_path("tiny-qwen2-policy")
    args.dtype = resolve_dtype_name(args.dtype)
    args.server_env, args.ingress_replicas = {}, 1  # what serve_throughput.start_server reads besides
    levels = [int(c) for c in args.concurrency.split(",")]
    kinds = {"one": "cooper", "replicated": "replicas1"}
    with tempfile.TemporaryDirectory() as workdir:
        for service in args.services.split(","):
            measure(args, kinds[service], levels, workdir)


if __name__ == "__main__":
    main()
