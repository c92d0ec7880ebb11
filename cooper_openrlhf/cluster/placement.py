"""GPU placement of a Cooper RL run: which role gets how many GPUs, from the allocation alone (pure).

The rule (`plan_placement`), for N nodes with G GPUs each (T = N x G GPUs):
  1. actor: half the allocation -- N/2 whole nodes when N >= 2 (N odd: (N-1)/2, and at least one), G/2 GPUs of
     the one node when N = 1. The reference model is colocated on the actor's GPUs (`--train.colocate_actor_ref`):
     it only runs forwards, between the policy's generation and update.
  2. reward model (cooper and static arms): T/8 GPUs, at least 1, on its own GPUs so that its update overlaps
     the policy update; none for the rule arm.
  3. a dedicated assistant engine (`--cooper.assistant model`, cooper arm only): 1 GPU (train_cooper starts one
     vLLM engine with tensor parallel size 1 for it).
  4. vLLM rollout engines: every remaining GPU, in engines of `tp` GPUs each (default 1: a <= 7B policy fits one
     80 GB GPU, and more engines beat wider ones for throughput); GPUs left over by an uneven split stay idle
     and are reported.
For 1 x 8: actor 4 (+ ref), RM 1, assistant 1, vLLM 2 x TP1. For 2 x 8: actor 8, RM 2, assistant 1, vLLM 5.
Every count can be overridden; `check_placement` then verifies that the roles fit the allocation (or are
colocated with `colocate_all`, where the engines share the actor's GPUs and the RM's must fit on them too).
docs/cluster.md derives the memory each role needs on 80 GB GPUs.
"""

from dataclasses import dataclass

from cooper_openrlhf.cluster.arms import ARMS, PAPER_ARMS


class PlacementError(ValueError):
    """A placement that cannot run on the allocation; the message names the variable to change."""


@dataclass(frozen=True)
class Placement:
    """GPU counts per role. Roles spanning nodes use whole nodes (OpenRLHF's num_nodes x num_gpus_per_node)."""

    nodes: int
    gpus_per_node: int
    actor_nodes: int
    actor_gpus_per_node: int
    rm_nodes: int
    rm_gpus_per_node: int
    vllm_engines: int
    vllm_tp: int
    assistant_gpus: int
    colocate_all: bool = False

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def actor_gpus(self) -> int:
        return self.actor_nodes * self.actor_gpus_per_node

    @property
    def rm_gpus(self) -> int:
        return self.rm_nodes * self.rm_gpus_per_node

    @property
    def vllm_gpus(self) -> int:
        return self.vllm_engines * self.vllm_tp

    @property
    def used_gpus(self) -> int:
        """GPUs the roles hold; with colocate_all, engines and RM sit on the actor's GPUs."""
        if self.colocate_all:
            return self.actor_gpus + self.assistant_gpus
        return self.actor_gpus + self.rm_gpus + self.vllm_gpus + self.assistant_gpus

    def openrlhf_flags(self) -> list[str]:
        """The train_cooper (OpenRLHF) flags that place the roles."""
        flags = ["--actor.num_nodes", str(self.actor_nodes), "--actor.num_gpus_per_node", str(self.actor_gpus_per_node),
                 "--ref.num_nodes", str(self.actor_nodes), "--ref.num_gpus_per_node", str(self.actor_gpus_per_node),
                 "--vllm.num_engines", str(self.vllm_engines), "--vllm.tensor_parallel_size", str(self.vllm_tp)]
        flags += ["--train.colocate_all"] if self.colocate_all else ["--train.colocate_actor_ref"]
        if self.rm_gpus:
            flags += ["--reward.num_nodes", str(self.rm_nodes), "--reward.num_gpus_per_node", str(self.rm_gpus_per_node)]
        return flags

    def describe(self) -> str:
        idle = self.total_gpus - self.used_gpus
        parts = [f"actor+ref {self.actor_gpus} ({self.actor_nodes}x{self.actor_gpus_per_node})",
                 f"RM {self.rm_gpus}" + (f" ({self.rm_nodes}x{self.rm_gpus_per_node})" if self.rm_gpus else ""),
                 f"vLLM {self.vllm_engines} engine(s) x TP{self.vllm_tp}" + (" on the actor's GPUs" if self.colocate_all else ""),
                 f"assistant {self.assistant_gpus}"]
        return f"{self.nodes} node(s) x {self.gpus_per_node} GPUs = {self.total_gpus}: " + ", ".join(parts) + \
            (f", idle {idle}" if idle else "")


def _span(gpus: int, gpus_per_node: int, variable: str) -> tuple[int, int]:
    """(num_nodes, num_gpus_per_node) for a role of `gpus` GPUs: within one node, or whole nodes."""
    if gpus <= gpus_per_node:
        return 1, gpus
    if gpus % gpus_per_node:
        raise PlacementError(f"{variable}={gpus}: a role larger than one node ({gpus_per_node} GPUs) must use whole "
                             f"nodes (a multiple of {gpus_per_node})")
    return gpus // gpus_per_node, gpus_per_node


def _positive(value: int, variable: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise PlacementError(f"{variable}={value!r}: must be an integer >= {minimum}")
    return value


def plan_placement(nodes: int, gpus_per_node: int, *, arm: str = "cooper", assistant_model: bool = False,
                   actor_gpus: int | None = None, rm_gpus: int | None = None, vllm_engines: int | None = None,
                   vllm_tp: int = 1, colocate_all: bool = False) -> Placement:
    """The placement of the module docstring's rule; any count given overrides the rule (then checked)."""
    _positive(nodes, "NODES")
    _positive(gpus_per_node, "GPUS_PER_NODE")
    _positive(vllm_tp, "VLLM_TP")
    if arm not in PAPER_ARMS:
        raise PlacementError(f"ARM={arm!r}: must be one of {', '.join(PAPER_ARMS)}")
    total = nodes * gpus_per_node
    has_rm = ARMS[arm].reward == "rm"
    assistant = 1 if assistant_model and ARMS[arm].trains_rm else 0
    if actor_gpus is None:
        actor_gpus = max(1, nodes // 2) * gpus_per_node if nodes >= 2 else max(1, gpus_per_node // 2)
    _positive(actor_gpus, "ACTOR_GPUS")
    if rm_gpus is None:
        rm_gpus = max(1, total // 8) if has_rm else 0
    _positive(rm_gpus, "RM_GPUS", minimum=0)
    if not has_rm and rm_gpus:
        raise PlacementError(f"RM_GPUS={rm_gpus}: the {arm} arm has no reward model; leave RM_GPUS unset or 0")
    if has_rm and not rm_gpus:
        raise PlacementError(f"RM_GPUS=0: the {arm} arm needs at least one GPU for the reward model")
    if vllm_engines is None:
        free = actor_gpus if colocate_all else total - actor_gpus - rm_gpus - assistant
        vllm_engines = free // vllm_tp
        if vllm_engines < 1:
            raise PlacementError(
                f"NODES={nodes} x GPUS_PER_NODE={gpus_per_node}: no GPU is left for a vLLM engine of VLLM_TP={vllm_tp} "
                f"after actor {actor_gpus}, RM {rm_gpus}, assistant {assistant}; allocate more GPUs or lower "
                f"ACTOR_GPUS / RM_GPUS / VLLM_TP")
    _positive(vllm_engines, "VLLM_ENGINES")
    actor_nodes, actor_per_node = _span(actor_gpus, gpus_per_node, "ACTOR_GPUS")
    rm_nodes, rm_per_node = _span(rm_gpus, gpus_per_node, "RM_GPUS") if rm_gpus else (0, 0)
    placement = Placement(nodes, gpus_per_node, actor_nodes, actor_per_node, rm_nodes, rm_per_node, vllm_engines,
                          vllm_tp, assistant, colocate_all)
    check_placement(placement)
    return placement


def check_placement(p: Placement) -> None:
    """Raise `PlacementError` naming the variables when the roles do not fit the allocation."""
    if p.vllm_tp > p.gpus_per_node:
        raise PlacementError(f"VLLM_TP={p.vllm_tp}: a tensor-parallel engine must fit on one node "
                             f"(GPUS_PER_NODE={p.gpus_per_node})")
    if p.colocate_all:
        if p.vllm_gpus != p.actor_gpus:
            raise PlacementError(f"COLOCATE_ALL=1 needs VLLM_ENGINES x VLLM_TP = ACTOR_GPUS (OpenRLHF shares one "
                                 f"placement group); got {p.vllm_engines} x {p.vllm_tp} != {p.actor_gpus}")
        if p.rm_gpus > p.actor_gpus:
            raise PlacementError(f"COLOCATE_ALL=1: RM_GPUS={p.rm_gpus} must be <= ACTOR_GPUS={p.actor_gpus} "
                                 "(the RM takes bundles of the actor's placement group)")
    if p.used_gpus > p.total_gpus:
        asked = (f"actor {p.actor_gpus} + assistant {p.assistant_gpus}" if p.colocate_all else
                 f"actor {p.actor_gpus} + RM {p.rm_gpus} + vLLM {p.vllm_engines}x{p.vllm_tp} + assistant {p.assistant_gpus}")
        raise PlacementError(f"{asked} = {p.used_gpus} GPUs asked, but NODES={p.nodes} x GPUS_PER_NODE="
                             f"{p.gpus_per_node} = {p.total_gpus} allocated; lower ACTOR_GPUS / RM_GPUS / VLLM_ENGINES "
                             "/ VLLM_TP, set COLOCATE_ALL=1, or allocate more nodes")
