"""A stateless gloo process group for broadcasting policy weights into vLLM on CPU.

OpenRLHF syncs weights from DeepSpeed rank 0 into the vLLM workers through vLLM's
`PyNcclCommunicator` (openrlhf/utils/distributed_util.py:13-26), which needs CUDA and NCCL.
This group has the one method OpenRLHF calls on it, `broadcast(tensor, src, stream)`, and is built
the same stateless way (its own TCPStore, outside the default torch.distributed group of either side),
so both ends of OpenRLHF's sync code run unchanged on CPU.
"""

from datetime import timedelta

import torch
import torch.distributed as dist


class GlooBroadcastGroup:
    """World = DeepSpeed rank 0 (rank 0) + every vLLM worker; `broadcast` is blocking."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout_s: float = 600):
        timeout = timedelta(seconds=timeout_s)
        # The prefix keeps this group's keys apart from anything else sharing the store's port.
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore("cooper_weight_sync", store), rank, world_size, timeout)
        self._store = store  # the store must outlive the group
        self.rank = rank
        self.world_size = world_size

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream=None) -> None:
        # `stream` is the CUDA stream of PyNcclCommunicator's signature; there is none on CPU.
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self._pg.broadcast([tensor], opts).wait()


def stateless_init_gloo_group(master_address, master_port, rank, world_size, device=None,
                              timeout_s: float = 600) -> GlooBroadcastGroup:
    """Drop-in for `openrlhf.utils.distributed_util.stateless_init_process_group` (same arguments)."""
    store = dist.TCPStore(master_address, int(master_port), world_size, is_master=(rank == 0),
                          timeout=timedelta(seconds=timeout_s))
    return GlooBroadcastGroup(store, rank, world_size, timeout_s)
