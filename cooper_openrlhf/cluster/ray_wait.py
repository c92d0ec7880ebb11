"""Wait until a Ray cluster started by a launcher has every node's GPUs, or fail fast saying which node and log.

`python -m cooper_openrlhf.cluster.ray_wait --address HOST:PORT --nodes N --gpus TOTAL
    --watch NAME=PID=LOG ... [--head-timeout S] [--join-timeout S]`

The cluster is read through the `ray` command (`ray list nodes --format json`, Ray's state API), the same
boundary a user has. While waiting, every watched process (the `srun` step running `ray start --block` on a
node) is checked: one that exits means that node's Ray is down, and the error names its log at once
instead of waiting for the time-out. Exit status 0 when ready, 3 with a message otherwise.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

EXIT_NOT_READY = 3


class ClusterNotReady(RuntimeError):
    """The head did not come up, a node's Ray exited, or not every node joined in time."""


@dataclass(frozen=True)
class Watched:
    """A node's `ray start --block` step: its name, the pid of the local srun that runs it, its log."""

    name: str
    pid: int
    log: str

    @classmethod
    def parse(cls, text: str) -> "Watched":
        name, pid, log = text.split("=", 2)
        return cls(name, int(pid), log)


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        return finished == 0
    except ChildProcessError:  # not our child (the usual case): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie (exited, not yet reaped by the launcher's shell) is dead too
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().split(") ", 1)[1][0] != "Z"
        except OSError:
            return True


# A line of a Ray log that reports a failure ("ERROR dashboard.py:326 -- ...", "RuntimeError: Module ... failed").
_ERROR_LINE = re.compile(r"\bERROR\b|^\w*Error: |\bfailed\b")
RAY = os.environ.get("COOPER_RAY", "ray")  # the launcher's `ray` (next to COOPER_PYTHON), else PATH's


def list_nodes(address: str, timeout: float = 30.0) -> list[dict] | None:
    """Alive nodes as Ray reports them, or None while the head does not answer."""
    try:
        result = subprocess.run([RAY, "list", "nodes", "--address", address, "--format", "json", "--limit", "10000"],
                                capture_output=True, text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, FileNotFoundError):
        return None
    if result.returncode != 0:
        return None
    try:
        nodes = json.loads(result.stdout)
    except json.JSONDecodeError:
        return None
    return [node for node in nodes if node.get("state") == "ALIVE"]


def _quote_log(path: str, lines: int, only: re.Pattern | None = None) -> str:
    """The last `lines` non-empty lines of a node's log (those matching `only`, if given), indented, to quote under
    an error; empty when the log cannot be read from here (another host).

    A node that exited: its log's end says why (a port in use, a raylet that did not register). A head that started
    but never answers: it has usually lost its dashboard (which `ray list nodes` asks), and the reason is an error
    line above the final status lines, so only error lines are quoted."""
    try:
        with open(path, errors="replace") as log:
            text = log.read()[-200_000:]
    except OSError:
        return ""
    kept = [line.rstrip() for line in text.splitlines() if line.strip() and (only is None or only.search(line))]
    return "".join(f"\n    {line}" for line in kept[-lines:])


def wait_for_cluster(address: str, nodes: int, gpus: float, watched: list[Watched], head_timeout: float,
                     join_timeout: float, poll_s: float = 2.0, list_nodes=list_nodes) -> list[dict]:
    """Block until `nodes` alive nodes with `gpus` GPUs in total; raise `ClusterNotReady` naming node and log."""
    start = time.monotonic()
    head, head_up_at = (watched[0] if watched else None), None
    while True:
        for item in watched:
            if not _alive(item.pid):
                role = "head" if item is head else "worker"
                raise ClusterNotReady(f"the Ray {role} on {item.name} exited before the cluster was ready; "
                                      f"see its log: {item.log}{_quote_log(item.log, 6)}")
        alive = list_nodes(address)
        now = time.monotonic()
        if alive is None:
            if now - start > head_timeout:
                log = f"; its log: {head.log}{_quote_log(head.log, 4, _ERROR_LINE)}" if head else ""
                raise ClusterNotReady(f"the Ray head at {address} did not answer within {head_timeout:.0f} s{log}")
        else:
            head_up_at = head_up_at or now
            have = sum(float(node.get("resources_total", {}).get("GPU", 0)) for node in alive)
            if len(alive) >= nodes and have >= gpus:
                return alive
            if now - head_up_at > join_timeout:
                joined = {node.get("node_ip") for node in alive}
                logs = ", ".join(item.log for item in watched[1:]) or "(none watched)"
                raise ClusterNotReady(f"only {len(alive)} of {nodes} nodes ({have:g} of {gpus:g} GPUs) joined within "
                                      f"{join_timeout:.0f} s of the head (joined: {sorted(map(str, joined))}); worker "
                                      f"logs: {logs}")
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cooper_openrlhf.cluster.ray_wait", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True, help="the head's HOST:PORT (GCS)")
    parser.add_argument("--nodes", type=int, required=True, help="nodes expected")
    parser.add_argument("--gpus", type=float, required=True, help="GPUs expected over all nodes")
    parser.add_argument("--watch", action="append", default=[], metavar="NAME=PID=LOG",
                        help="a node's ray-start process to watch (the head first), repeatable")
    parser.add_argument("--head-timeout", type=float, default=180.0, help="seconds for the head to answer")
    parser.add_argument("--join-timeout", type=float, default=300.0, help="seconds, after the head is up, for every node")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between checks")
    args = parser.parse_args(argv)
    try:
        alive = wait_for_cluster(args.address, args.nodes, args.gpus, [Watched.parse(w) for w in args.watch],
                                 args.head_timeout, args.join_timeout, args.poll)
    except ClusterNotReady as exc:
        print(f"ray_wait: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_NOT_READY
    print(f"ray_wait: {len(alive)} node(s) with {args.gpus:g} GPUs ready at {args.address}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
