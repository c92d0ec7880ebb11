"""Which ingress replica holds which group places, so that the places of one that died are given back.

An ingress reserves a place for each sample before it scores it, and records or releases the place after. An
ingress replica that dies in between (killed, out of memory) does neither: its places stay taken, and the group
stays open with fewer scored samples than taken places. The client's retry of those samples (OpenRLHF's, 1 s
later, which Serve's proxy sends to another ingress) then finds the prompt's group full and opens a new one: two
groups of that prompt that never complete, neither learned from. So the registry notes each place's holder here,
and when a sample finds its prompt's groups full but not all scored, it asks whether their holders are alive and
gives back the places of the dead ones first: the retry takes the place its first try held.

Pure bookkeeping; the registry asks the liveness (an actor call fails at once for a dead actor).
"""

from collections import Counter


class PlaceHolders:
    """Places taken and not yet given back, per holder (an ingress replica's actor id)."""

    def __init__(self):
        self.handles: dict[str, object] = {}  # holder id -> the handle the registry pings it through
        self.held: dict[str, Counter] = {}  # holder id -> {group id: places}

    def take(self, holder: tuple[str, object] | None, group_id: int) -> None:
        """`holder` (id, handle) took a place in group `group_id`; None: a caller the registry cannot ping."""
        if holder is None:
            return
        holder_id, handle = holder
        self.handles.setdefault(holder_id, handle)
        self.held.setdefault(holder_id, Counter())[group_id] += 1

    def give_back(self, holder_id: str | None, group_id: int) -> None:
        """One of `holder_id`'s places in `group_id` was recorded or released."""
        places = self.held.get(holder_id)
        if places is None or not places[group_id]:
            return
        places[group_id] -= 1
        if not places[group_id]:
            del places[group_id]

    def holding(self, group_ids: set[int]) -> list[str]:
        """The holders with places in any of `group_ids`."""
        return [h for h, places in self.held.items() if any(g in places for g in group_ids)]

    def drop(self, holder_id: str) -> Counter:
        """Forget a dead holder; returns its places by group, for the registry to give back."""
        self.handles.pop(holder_id, None)
        return self.held.pop(holder_id, Counter())
