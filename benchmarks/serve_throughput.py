"""Throughput of the reward service against OpenRLHF's own `serve_rm.py`, and against the bare RM forward.

    python benchmarks/serve_throughput.py [--rm PATH] [--policy PATH] [--requests 512] [--concurrency 1,16,64,256]
    python benchmarks/serve_throughput.py --replicas 1,2     # one process against Ray Serve with 1 and 2 replicas
    python benchmarks/serve_throughput.py --servers cooper --server-env OMP_NUM_THREADS=1   # cooper under an env
    python benchmarks/serve_throughput.py --servers cooper,serve_rm --concurrency 1 --alone  # one server up at a time
    python benchmarks/serve_throughput.py --servers serve_rm,cooper,cooper_stub_verifier --concurrency 1 --blocks 12
    python benchmarks/serve_throughput.py --replicas 1,2,4 --stand-in-forward-ms 50   # the forward as a GPU's wait

Without --rm it measures two RMs in turn: the tiny Qwen2 RM (per-request work is the cost) and the lab's MiniLM
VerifyRM architecture (the forward is the cost; stock serve_rm cannot load an encoder, so it is left out there).

One run measures, on the same RM, dtype and stream of single-sample requests (OpenRLHF's body: query = chat-
templated prompt + response, one sample per POST, as its vLLM actors send them), with an aiohttp client holding
`concurrency` requests in flight:
  serve_rm    `python -m openrlhf.cli.serve_rm` (stock; the CPU runtime only stands in for flash-attn)
  serve_rm_passive  the same with OMP_WAIT_POLICY=PASSIVE, as `cli.serve` sets it (the baseline is serve_rm's
              better policy at each concurrency)
  cooper      `python -m cooper_openrlhf.cli.serve`, learning off (RM + rule verifier per sample)
  cooper_stub_verifier  the same with a verifier that answers at once (`stub_verifier_serve.py`): against cooper,
              what the rule verification costs (a baseline only: its rewards are not verified)
  learning    the same with --learn: groups of --group-size, an RM update every --groups-per-update groups; new
              groups wait for an update in flight (the paper's timing)
  learning_nowait  the same with --no-wait-for-update (what the updates cost besides the wait)
  replicasK   `cli.serve --replicas K` (Ray Serve: proxy, ingress, K scoring replicas; learning off; with
              `--keep-groups`, it and cooper keep groups in steps, so the group registry places and records
              every sample, and its calls per sample are printed), with
              `--replicas K,...`; then the servers default to the two ceilings, cooper and the replicated ones, the
              concurrency to 64,256, the RM to the tiny one, and the ratios printed are each K against the first,
              against cooper and against Serve's ceiling
  serve_ceiling `noop_reward_server.py --ray-serve`: the no-work app below as one ingress behind Ray Serve's proxy
              (the bound Serve's front puts on the replicated servers here, however many replicas)
  http_ceiling  `noop_reward_server.py`: the same protocol and server stack with no work behind it (the bound the
              single-sample POST itself puts on any reward server here)
  bare        no HTTP: `rm.model.score_logits` over the same samples at its best batch size (the limit), in a
              fresh process under each OpenMP wait policy (libgomp's default spin, and passive, as `cli.serve`
              runs), the better taken
and prints samples/s, p50 and p99 latency per server and concurrency, then the ratios the targets are set in:
cooper / bare at concurrency 64, cooper / serve_rm at each concurrency, learning / cooper, and each server against
the HTTP ceiling (and, with `cooper_stub_verifier` up, cooper against it: what the verification costs). The client
runs on the same machine as the servers (on a 2-core machine it takes a share of the same 2 cores: about 0.2 ms of
CPU per request at concurrency 64), so every server's rate, the ceiling's included, is what is left beside it.
Servers are measured in turn on loopback ports; each is warmed up, and timed only once every server is idle (its
process tree, Ray's included, under 0.25 core): a learning server goes on training on the groups a stream completed
after the stream ends, and the next server measured would otherwise share its cores.
With `--stand-in-forward-ms X` cooper and the replicated servers run `stand_in_forward_serve.py`: the RM's forward
is a wait of X ms per batch of up to --max-batch samples (plus `--stand-in-per-sample-ms` per sample) that leaves the
CPU free, as a GPU's does, and everything else is real; the bare forward is then not measured, and each replicated
server's rate per replica is printed against the stand-in's own bound (max-batch samples per wait).

Each sample of a group is a distinct text, as a policy sampling at temperature 1 writes them (the verifier's
parse cache and any other cache get no help from repeats).

With `--blocks K` each level's stream is cut into K blocks and the servers take turns block by block, in an order
that rotates; a server's rate is its median block, and a ratio is the median over blocks of the two servers' rates
in the same block (`--requests` is then a block's, and each level starts with one more block, a warm-up not
counted). A drift of the machine's speed over a run then moves both sides of a ratio alike, which lets the run
read a few percent between servers that separate runs (or `--alone`) cannot: on a small VM two runs of the same
server can differ by more than that.
"""

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_stream(policy: str, count: int, group_size: int, offset: int = 0) -> list[dict]:
    """`count` OpenRLHF request bodies: groups of `group_size` answers to arithmetic questions, right and wrong;
    `offset` shifts the questions (a fresh set of prompts)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    bodies = []
    for k in range(count):
        group, member = divmod(k, group_size)
        group += offset
        a, b = 3 + group % 97, 5 + group // 97
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False,
                                               add_generation_prompt=True)
        answer = a + b + (member % 3 == 2)
        completion = f"First, {a} + {b} = {answer} (way {member + 1}). The answer is {answer}.{tokenizer.eos_token}"
        bodies.append({"query": [prompt + completion], "prompts": [prompt], "labels": [str(a + b)]})
    return bodies


async def run_load(url: str, bodies: list[dict], concurrency: int) -> tuple[float, list[float]]:
    """(samples/s, per-request latencies) with `concurrency` requests in flight; every answer must be 200."""
    latencies: list[float] = []
    queue = list(reversed(bodies))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180),
                                     connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker():
            while queue:
                body = queue.pop()
                start = time.perf_counter()
                async with session.post(url, json=body) as response:
                    if response.status != 200:
                        raise RuntimeError(f"{url}: HTTP {response.status}: {await response.text()}")
                    await response.json()
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(bodies) / (time.perf_counter() - start), latencies


def servers_cpu_seconds(processes) -> float:
    """CPU seconds used so far by the servers' process trees (a server's children: verifier workers, Ray's
    processes), so that other work on the machine does not count."""
    import psutil

    total = 0.0
    for process in processes:
        try:
            root = psutil.Process(process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for member in tree:
            try:
                times = member.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
    return total


def wait_quiet(processes, max_cores: float = 0.25, window_s: float = 1.0, timeout_s: float = 120) -> float:
    """Seconds until the servers are idle (under `max_cores` of CPU over a window): a learning server trains on
    the groups a stream completed after the stream ends, and a server measured meanwhile would share the cores."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        before = servers_cpu_seconds(processes)
        time.sleep(window_s)
        if servers_cpu_seconds(processes) - before < max_cores * window_s:
            break
    return time.monotonic() - start


def last_step_metric(metrics_url: str, key: str) -> float:
    """A `cooper_serve_round{key=...}` value at a server's /metrics (NaN before its first round)."""
    import re

    import requests

    text = requests.get(metrics_url, timeout=30).text
    found = re.search(r'cooper_serve_round\{key="%s"\} (\S+)' % re.escape(key), text)
    return float(found.group(1)) if found else float("nan")


def registry_calls(url: str) -> float:
    """The group registry's `registry_calls` gauge at a replicated server's /metrics (NaN where it has none)."""
    import re

    import requests

    text = requests.get(url.replace("/get_reward", "/metrics"), timeout=30).text
    found = re.search(r'cooper_serve\{name="registry_calls"\} (\S+)', text)
    return float(found.group(1)) if found else float("nan")


def wait_up(url: str, process: subprocess.Popen, log: str, timeout_s: float = 900) -> None:
    """Until the server answers; Serve's proxy answers 404/503 before its app is deployed, so not those."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {open(log).read()[-3000:]}")
        try:
            if requests.post(url, json={}, timeout=5).status_code not in (404, 503):
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not up after {timeout_s}s: {open(log).read()[-3000:]}")


def cooper_command(args) -> list[str]:
    """`cli.serve`, or with --stand-in-forward-ms the same behind `stand_in_forward_serve.py`."""
    if args.stand_in_forward_ms is None:
        return [sys.executable, "-m", "cooper_openrlhf.cli.serve"]
    return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_in_forward_serve.py"),
            "--forward-ms", str(args.stand_in_forward_ms), "--per-sample-ms", str(args.stand_in_per_sample_ms)]


def start_server(kind: str, args, port: int, workdir: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if kind in ("http_ceiling", "serve_ceiling"):
        argv = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "noop_reward_server.py"),
                "--port", str(port), *(["--ray-serve"] if kind == "serve_ceiling" else [])]
    elif kind == "cooper_stub_verifier":
        env.update(args.server_env)
        argv = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub_verifier_serve.py"),
                "--rm", args.rm, "--policy", args.policy, "--port", str(port), "--dtype", args.dtype,
                "--group-size", str(args.group_size), "--max-batch", str(args.max_batch)]
    elif kind.startswith("serve_rm"):
        if kind == "serve_rm_passive":
            # The fair baseline: stock serve_rm with the OpenMP wait policy cli.serve sets for itself.
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        code = ("from cooper_openrlhf.runtime import install_cpu_runtime; install_cpu_runtime(); import runpy, sys; "
                "runpy.run_module('openrlhf.cli.serve_rm', run_name='__main__', alter_sys=True)")
        argv = [sys.executable, "-c", code, "--reward.model_name_or_path", args.rm, "--port", str(port),
                "--host", "127.0.0.1", "--ds.param_dtype", args.openrlhf_dtype, "--ds.attn_implementation", "eager"]
    else:
        env.update(args.server_env)  # --server-env: this package's servers only
        argv = [*cooper_command(args), "--rm", args.rm, "--policy", args.policy,
                "--port", str(port), "--dtype", args.dtype, "--group-size", str(args.group_size),
                "--max-batch", str(args.max_batch)]
        if kind.startswith("learning"):
            # The stream never pauses between "steps", so it breaks the trainer-group check by design.
            argv += ["--learn", "--groups-per-update", str(args.groups_per_update),
                     "--state-dir", os.path.join(workdir, kind), "--checkpoint-every", "0", "--no-group-check"]
        if kind == "learning_nowait":
            argv += ["--no-wait-for-update"]
        if kind.startswith("replicas"):
            argv += ["--replicas", kind[len("replicas"):], "--ingress-replicas", str(args.ingress_replicas)]
        if args.keep_groups and (kind == "cooper" or kind.startswith("replicas")):
            argv += ["--groups-per-update", str(args.groups_per_update), "--no-group-check"]
    log = os.path.join(workdir, f"{kind}.log")
    process = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    process.log = log
    return process


def bare_forward(args) -> tuple[int, float]:
    """(best batch size, samples/s) of score_logits over the request stream's samples, no HTTP: the better of a
    fresh process under each OpenMP wait policy (libgomp reads it when torch loads, so each needs its own process)."""
    import json

    best = (0, 0.0)
    for policy in ("", "PASSIVE"):  # "": libgomp's default (spin, then sleep)
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        if policy:
            env["OMP_WAIT_POLICY"] = policy
        argv = [sys.executable, os.path.abspath(__file__), "--bare-only", "--rm", args.rm, "--policy", args.policy,
                "--requests", str(args.requests), "--dtype", args.dtype, "--group-size", str(args.group_size)]
        run = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        for line in run.stdout.splitlines():
            if line.startswith("{"):
                found = tuple(json.loads(line)["best"])
            else:
                print(f"{line} (OpenMP wait policy: {policy or 'default'})", flush=True)
        best = max(best, found, key=lambda x: x[1])
    return best


def bare_forward_here(args, bodies: list[dict]) -> tuple[int, float]:
    """(best batch size, samples/s) of score_logits over the same samples, no HTTP, in this process."""
    from transformers import AutoTokenizer

    from cooper_openrlhf.rm.model import load_rm, score_logits, usable_max_length
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name, torch_dtype
    from cooper_openrlhf.serve.protocol import PromptSplitter

    splitter = PromptSplitter.from_tokenizer(AutoTokenizer.from_pretrained(args.policy))
    samples = [splitter.split(b["query"][0], b["prompts"][0], b["labels"][0]) for b in bodies]
    model, tokenizer, version = load_rm(args.rm, dtype=torch_dtype(resolve_dtype_name(args.dtype)))
    max_length = usable_max_length(model)
    columns = ([s.question for s in samples], [s.reference for s in samples], [s.completion for s in samples])
    best = (0, 0.0)
    for batch in (1, 8, 32, 64):
        score_logits(model, tokenizer, *(c[:batch] for c in columns), max_length=max_length, template_version=version,
                     batch_size=batch)  # warm-up
        start = time.perf_counter()
        score_logits(model, tokenizer, *columns, max_length=max_length, template_version=version, batch_size=batch)
        rate = len(samples) / (time.perf_counter() - start)
        print(f"  bare forward, batch {batch:3d}: {rate:7.1f} samples/s", flush=True)
        best = max(best, (batch, rate), key=lambda x: x[1])
    return best


def minilm_verifyrm(workdir: str) -> str:
    """The lab's VerifyRM architecture (MiniLM-L6 with a one-logit head) as a VerifyRM folder: a real encoder, where
    the forward is the cost. Its head is fresh (throughput does not depend on what it learnt)."""
    from cooper_openrlhf.models import model_path
    from cooper_openrlhf.rm.model import load_rm
    from cooper_openrlhf.rm.export import export_rm

    model, tokenizer, version = load_rm(model_path("minilm-l6-v2"), init_head=True)
    return str(export_rm(model, tokenizer, os.path.join(workdir, "minilm-verifyrm"), template_version=version,
                         max_length=512))


def time_servers(args, levels: list[int], kinds: list[str], workdir: str, results: dict) -> None:
    """Start `kinds`, warm each up, time each at every level in turn (once all are idle), stop them."""
    servers = {}
    try:
        for kind in kinds:
            port = free_port()
            servers[kind] = (f"http://127.0.0.1:{port}/get_reward", start_server(kind, args, port, workdir))
        for kind, (url, process) in servers.items():
            wait_up(url, process, process.log)
            asyncio.run(run_load(url, make_stream(args.policy, 64, args.group_size, offset=10_000), 16))  # warm-up
            results[kind] = {}
        for level in levels:
            # each server gets prompts it has not seen (a learning server would otherwise re-open old groups);
            # with blocks, --requests is a block's, and one more block comes first as a warm-up
            count = args.blocks + 1 if args.blocks > 1 else 1
            streams = {kind: make_stream(args.policy, args.requests * count, args.group_size, offset=1000 * level)
                       for kind in servers}
            blocks = {kind: [] for kind in servers}  # per server: (samples/s, latencies) of each block
            waited = dict.fromkeys(servers, 0.0)
            calls = dict.fromkeys(servers, 0.0)  # registry calls of the timed streams (replicated, --keep-groups)
            for block in range(count):
                names = list(servers)
                for kind in names[block % len(names):] + names[:block % len(names)]:
                    waited[kind] += wait_quiet([process for _, process in servers.values()])
                    stream = streams[kind][block * args.requests:(block + 1) * args.requests]
                    counted = args.keep_groups and kind.startswith("replicas") and (count == 1 or block > 0)
                    before = registry_calls(servers[kind][0]) if counted else 0.0
                    blocks[kind].append(asyncio.run(run_load(servers[kind][0], stream, level)))
                    calls[kind] += registry_calls(servers[kind][0]) - before if counted else 0.0
            for kind, timed in blocks.items():
                timed = timed[1:] if count > 1 else timed
                rates = [rate for rate, _ in timed]
                q = statistics.quantiles([x for _, latencies in timed for x in latencies], n=100)
                results[kind][level] = (statistics.median(rates), q[49], q[98], rates)
                spread = f" (blocks {min(rates):.0f}-{max(rates):.0f})" if len(rates) > 1 else ""
                if calls[kind]:  # one sample per request
                    spread += f", {calls[kind] / (args.requests * len(timed)):.3f} registry calls per sample"
                print(f"  {kind:15s} concurrency {level:3d}: {statistics.median(rates):7.1f} samples/s{spread}, p50 "
                      f"{q[49] * 1000:7.1f} ms, p99 {q[98] * 1000:7.1f} ms "
                      f"(waited {waited[kind]:.0f}s for idle servers)", flush=True)
        for kind, (url, _) in servers.items():
            if kind.startswith("learning"):  # what one RM update costs: the bound on learning / learning off
                fit = last_step_metric(url.replace("/get_reward", "/metrics"), "cooper_rm_fit_seconds")
                print(f"  {kind}: the last RM update took {fit:.2f} s (cooper/rm_fit_seconds)", flush=True)
    finally:
        for _, process in servers.values():
            process.terminate()
            process.wait(60)


def ratio(results: dict, kind: str, baseline: str, level: int) -> float:
    """`kind`'s rate over `baseline`'s at `level`: with blocks, the median of the ratios of the same blocks."""
    (rate, *_, rates), (base, *_, base_rates) = results[kind][level], results[baseline][level]
    if len(rates) > 1 and len(rates) == len(base_rates):
        return statistics.median(r / b for r, b in zip(rates, base_rates))
    return rate / base


def stand_in_bound(args) -> float:
    """Samples/s of one scorer whose every batch is full and waits the stand-in's time: what no host passes."""
    return args.max_batch / (args.stand_in_forward_ms / 1000 + args.max_batch * args.stand_in_per_sample_ms / 1000)


def measure(args, levels: list[int], kinds: list[str]) -> None:
    """One RM: the bare forward, every server at every level, and the ratios the targets are set in."""
    per = f"per block, {args.blocks} blocks and a warm-up block per level" if args.blocks > 1 else "per level"
    print(f"\n== RM {args.rm} ({args.dtype}; serve_rm {args.openrlhf_dtype}): {args.requests} single-sample "
          f"requests {per}; {os.cpu_count()} CPUs", flush=True)
    stand_in = args.stand_in_forward_ms is not None
    # the limit: the better of the bare forward before and after the servers, or the stand-in's samples per wait
    forward_limit = (lambda: (args.max_batch, stand_in_bound(args))) if stand_in else (lambda: bare_forward(args))
    first = forward_limit()
    results: dict[str, dict[int, tuple]] = {}  # kind -> level -> (samples/s, p50 s, p99 s, block rates)
    with tempfile.TemporaryDirectory() as workdir:
        if args.alone:  # each server with the machine to itself: up, measured at every level, down
            for kind in kinds:
                time_servers(args, levels, [kind], workdir, results)
        else:
            # All servers up at once, measured in turn at each level: a machine whose load drifts during the run
            # shifts every server's numbers alike, so the ratios hold.
            time_servers(args, levels, kinds, workdir, results)
    batch, limit = max(first, forward_limit(), key=lambda x: x[1])
    print(f"\nlimit: {'stand-in' if stand_in else 'bare'} forward {limit:.1f} samples/s at batch {batch}")
    cooper, ceiling = results.get("cooper"), results.get("http_ceiling")
    # serve_rm's better OpenMP policy at each level is the baseline "never below" is judged against
    stock_kinds = [k for k in ("serve_rm", "serve_rm_passive") if k in results]
    stock = {level: max(stock_kinds, key=lambda k: results[k][level][0]) for level in levels} if stock_kinds else None
    if cooper and 64 in cooper:
        print(f"cooper / {'stand-in' if stand_in else 'bare'} forward at concurrency 64: {cooper[64][0] / limit:.2f}x"
              f" (target >= 0.7)")
    if ceiling and 64 in ceiling:
        print(f"HTTP ceiling / bare forward at concurrency 64: {ceiling[64][0] / limit:.2f}x (no server of this "
              f"protocol on this machine and client can pass this ratio)")
    if ceiling:
        for kind in (k for k in results if k != "http_ceiling"):
            print(f"{kind} / HTTP ceiling: " + ", ".join(f"{ratio(results, kind, 'http_ceiling', level):.2f}x at "
                                                        f"{level}" for level in levels))
    if stock:
        for kind in ("cooper", "cooper_stub_verifier"):
            for level in levels if kind in results else ():
                print(f"{kind} / serve_rm (its better OpenMP policy) at concurrency {level}: "
                      f"{ratio(results, kind, stock[level], level):.2f}x" + (" (target >= 1.0)" if kind == "cooper" else
                                                                             " (no verification: not a target)"))
    if cooper and "cooper_stub_verifier" in results:
        for level in levels:
            print(f"cooper / cooper_stub_verifier at concurrency {level}: "
                  f"{ratio(results, 'cooper', 'cooper_stub_verifier', level):.2f}x (what the rule verification costs)")
    replicated = [kind for kind in kinds if kind.startswith("replicas") and kind in results]
    serve_ceiling = results.get("serve_ceiling")
    for kind in replicated:
        for level in levels:
            print(f"{kind} / {replicated[0]} at concurrency {level}: {ratio(results, kind, replicated[0], level):.2f}x"
                  + (f"; / cooper (one process): {ratio(results, kind, 'cooper', level):.2f}x" if cooper else "")
                  + (f"; / Serve's ceiling: {ratio(results, kind, 'serve_ceiling', level):.2f}x"
                     if serve_ceiling else ""))
            if stand_in:
                per_replica = results[kind][level][0] / int(kind[len("replicas"):])
                print(f"  per replica: {per_replica:.1f} samples/s, {per_replica / limit:.2f} of the stand-in's bound")
    for kind in ("learning", "learning_nowait"):
        if cooper and kind in results:
            for level in levels:
                print(f"{kind} / learning off at concurrency {level}: {ratio(results, kind, 'cooper', level):.2f}x"
                      f" (target >= 0.8)")


def main() -> None:
    from cooper_openrlhf.models import model_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rm", default=None, help="one RM folder (default: the tiny Qwen2 RM, then the MiniLM VerifyRM)")
    p.add_argument("--policy", default=None, help="policy tokenizer folder (default: the tiny Qwen2 policy)")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--concurrency", default="1,16,64,256")
    p.add_argument("--dtype", default="auto", help="cooper's --dtype (auto: bf16 where the CPU has bf16 units)")
    p.add_argument("--servers", default="http_ceiling,serve_rm,serve_rm_passive,cooper,learning,learning_nowait")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups-per-update", type=int, default=8)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--replicas", default=None, help="e.g. 1,2: also cli.serve --replicas K for each K (Ray Serve)")
    p.add_argument("--ingress-replicas", type=int, default=1, help="the replicated servers' --ingress-replicas")
    p.add_argument("--keep-groups", action="store_true",
                   help="cooper and the replicated servers keep groups, in steps of --groups-per-update, without "
                        "learning: every sample is placed in its group and recorded (in the replicated servers, the "
                        "group registry's calls); default: no groups, the services score and answer only")
    p.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for this package's servers (cooper, learning, replicas), e.g. "
                        "OMP_NUM_THREADS=1; repeatable")
    p.add_argument("--blocks", type=int, default=1,
                   help="cut each level's stream into this many blocks, servers taking turns block by block (module "
                        "docstring); default 1: each server's whole stream in turn")
    p.add_argument("--alone", action="store_true",
                   help="start each server alone, for its own levels only (default: all up at once, timed in turn)")
    p.add_argument("--stand-in-forward-ms", type=float, default=None,
                   help="cooper's and the replicated servers' RM forward: a wait of this many ms per batch, CPU left "
                        "free (stand_in_forward_serve.py); default: the real forward")
    p.add_argument("--stand-in-per-sample-ms", type=float, default=0.0, help="and this many ms per sample of it")
    p.add_argument("--bare-only", action="store_true", help=argparse.SUPPRESS)  # one bare_forward_here, as JSON
    args = p.parse_args()
    args.server_env = dict(item.split("=", 1) for item in args.server_env)
    if args.replicas:
        defaults = {"servers": "http_ceiling,serve_rm,serve_rm_passive,cooper,learning,learning_nowait",
                    "concurrency": "1,16,64,256"}
        if args.servers == defaults["servers"]:
            args.servers = "http_ceiling,serve_ceiling,cooper"
        if args.concurrency == defaults["concurrency"]:
            args.concurrency = "64,256"
        args.servers += "".join(f",replicas{k}" for k in args.replicas.split(","))
        args.rm = args.rm or model_path("tiny-qwen2-rm")
    args.policy = args.policy or model_path("tiny-qwen2-policy")
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name

    args.dtype = resolve_dtype_name(args.dtype)
    if args.bare_only:
        import json

        print(json.dumps({"best": bare_forward_here(args, make_stream(args.policy, args.requests, args.group_size))}))
        return
    args.openrlhf_dtype = "fp16" if args.dtype == "fp16" else "bf16"  # serve_rm offers only these two
    levels = [int(c) for c in args.concurrency.split(",")]
    kinds = args.servers.split(",")
    if args.stand_in_forward_ms is not None and any(k.startswith("learning") or k == "cooper_stub_verifier"
                                                    for k in kinds):
        p.error("--stand-in-forward-ms: learning off only, and not with cooper_stub_verifier's own script")
    if args.rm:
        measure(args, levels, kinds)
        return
    with tempfile.TemporaryDirectory() as rms:
        for rm in (model_path("tiny-qwen2-rm"), minilm_verifyrm(rms)):
            args.rm = rm
            # stock serve_rm loads a decoder RM only (get_llm_for_sequence_regression): an encoder is cooper's alone
            measure(args, levels, kinds if "qwen" in rm else [k for k in kinds if not k.startswith("serve_rm")])


if __name__ == "__main__":
    main()
