"""What the one-process service (`serve/service.py`) and the replicated service's group registry
(`serve/replicated/registry.py`) share about rounds and the trainer's groups: the check of open groups after each
reservation (invariant (1) of serve/trainer_groups.py), the refusal that follows a mismatch, and the supervised
round loop (expire, then run each complete round, one at a time; nothing a round raises ends the loop).

A class using it has `config` (a `ServiceConfig`), `groups` (a `GroupTracker`), `ready` (complete groups not yet
in a round), `group_mismatch`, `round_error`, `round_failures`, `_round_wakeup` (an asyncio.Event) and defines
`_rounds_done()`, `_expire_and_retire()` and `async _run_round(index, groups)`.
"""

import asyncio
import logging

from cooper_openrlhf.serve.trainer_groups import GroupMismatch, too_many_open

logger = logging.getLogger(__name__)


class RoundSupervisor:
    def _check_open_groups(self) -> None:
        """Invariant (1) of serve/trainer_groups.py, after every reservation."""
        # Per request: skipped where it cannot fire (no rounds to compare against, or already refused).
        if self.config.check_groups and self.config.groups_per_update and self.group_mismatch is None:
            self._refuse_groups(too_many_open([(g.prompt, g.reserved) for g in self.groups.open.values()],
                                              self.config.group_size, self.config.groups_per_update))

    def _refuse_groups(self, reason: str | None) -> None:
        if reason is not None and self.group_mismatch is None:
            self.group_mismatch = reason
            logger.error("the trainer's GRPO groups are not the service's; every request is refused from now on "
                         "(--no-group-check turns this check off): %s", reason)
            raise GroupMismatch(reason)

    async def _round_loop(self) -> None:
        """Turn complete groups into rounds, one at a time, and expire stale groups; a failure is logged, counted
        and shown (`_round_failed`), and the next round tries again."""
        per_round = self.config.groups_per_update
        while True:
            try:
                await asyncio.wait_for(self._round_wakeup.wait(), timeout=5.0)
            except asyncio.TimeoutError:
                pass
            self._round_wakeup.clear()
            try:
                self._expire_and_retire()
            except Exception as exc:
                self._round_failed("expiring groups", exc)
            while per_round and len(self.ready) >= per_round and self.group_mismatch is None:
                batch, self.ready = self.ready[:per_round], self.ready[per_round:]
                index = self._rounds_done()
                try:
                    await self._run_round(index, batch)
                except Exception as exc:
                    self._round_failed(f"round {index}", exc)
                else:
                    self.round_error = None

    def _round_failed(self, what: str, exc: Exception) -> None:
        logger.error("%s failed; the next round tries again", what, exc_info=exc)
        self.round_failures += 1
        self.round_error = f"{what}: {type(exc).__name__}: {exc}"
