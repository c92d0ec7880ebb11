"""A scoring replica: the RM's logit and the rule verifier's verdict of one sample, batched by Ray Serve.

Each replica holds the RM by version (`rm/scorer.py`'s `RMScorer`: version 0 loaded from `--rm`, later versions
fetched from the object store by the reference the registry gives, the first time a batch needs them, and dropped
when no open group is pinned to them) and one rule-verifier pool (`verify/pool.py`). Serve's `@serve.batch` gathers
the samples that concurrent requests send to this replica into one RM forward and one verifier batch, side by side
on worker threads. Each sample fails alone, as in one process: a batch that raises is scored again in halves
(`serve/batcher.py`'s `results_or_errors`), and a failing sample's exception is its own caller's.

A replica keeps no state a restart would lose: Serve replaces one that dies, and the ingress retries the calls it
had in flight (`ingress.py`).
"""

import asyncio
import logging
import os
from dataclasses import dataclass

from ray import serve

from cooper_openrlhf.serve.batcher import results_or_errors
from cooper_openrlhf.serve.replicated.retry import until_answered

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoreItem:
    """One sample as a replica scores it."""

    version: int  # the RM version its group is pinned to
    question: str
    reference: str
    completion: str  # as the client sent it: the RM's template normalises it, the rule verifier reads it whole


class Scorer:
    """See the module docstring. `args`: `cli.serve`'s flags (the RM, dtype, lengths, batching, verifier);
    `registry`: the group registry's handle (it holds the versions' weights)."""

    def __init__(self, args, registry):
        from cooper_openrlhf.serve.build import served_scorer
        from cooper_openrlhf.serve.replicated.registry import worker_logging
        from cooper_openrlhf.verify.pool import VerifierPool
        from cooper_openrlhf.verify.rule import RuleVerifierConfig

        worker_logging()
        self.rm = served_scorer(args)
        self.pool = VerifierPool(num_workers=1, deadline_s=args.verify_deadline_s,
                                 config=RuleVerifierConfig(answer_fallback=args.answer_fallback))
        self.registry = registry
        self.retry_for_s = args.request_timeout_s
        self._fetching: dict[int, asyncio.Future] = {}
        self.score_batch.set_max_batch_size(args.max_batch)
        self.score_batch.set_batch_wait_timeout_s(args.max_wait_ms / 1000)

    async def score(self, item: ScoreItem) -> tuple:
        """(RM logit, `verify.rule.VerifyOutcome`) of one sample; raises what failed on this sample alone."""
        result = await self.score_batch(item)
        if isinstance(result, Exception):
            raise result
        return result

    async def score_many(self, items: list[ScoreItem]) -> list:
        """Per item, (RM logit, `VerifyOutcome`) or the exception it failed with alone: one call for the samples an
        ingress gathered, merged by `@serve.batch` with what other calls bring."""
        return list(await asyncio.gather(*(self.score_batch(item) for item in items)))

    def pid(self) -> int:
        return os.getpid()

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)  # set from the flags in __init__
    async def score_batch(self, items: list[ScoreItem]) -> list:
        try:
            await self._hold_versions({item.version for item in items})
        except Exception as exc:
            return [exc] * len(items)
        logits, outcomes = await asyncio.gather(
            asyncio.to_thread(results_or_errors, self.rm.logits_of,
                              [(i.version, i.question, i.reference, i.completion) for i in items], "rm"),
            asyncio.to_thread(results_or_errors, self._verify, [(i.reference, i.completion) for i in items],
                              "verifier"))
        return [logit if isinstance(logit, Exception) else outcome if isinstance(outcome, Exception)
                else (logit, outcome) for logit, outcome in zip(logits, outcomes)]

    def _verify(self, pairs: list[tuple[str, str]]) -> list:
        return self.pool.verify_batch([r for r, _ in pairs], [c for _, c in pairs]).outcomes

    async def _hold_versions(self, versions: set[int]) -> None:
        """Fetch the weights of the versions this replica does not hold yet (once each, whatever the number of
        batches asking), and drop the ones no open group needs any more."""
        missing = versions - self.rm.versions()
        if not missing:
            return
        await asyncio.gather(*(self._fetch(version) for version in missing))

    async def _fetch(self, version: int) -> None:
        if version not in self._fetching:
            if version in self.rm.versions():  # loaded (and its fetch forgotten) since the batch asking looked
                return
            self._fetching[version] = asyncio.ensure_future(self._load(version))
        try:
            await asyncio.shield(self._fetching[version])
        finally:
            if self._fetching.get(version) is not None and self._fetching[version].done():
                self._fetching.pop(version, None)

    async def _load(self, version: int) -> None:
        async def weights():  # the reference and the weights again from a registry Ray restarted (`retry.py`)
            refs, keep = await self.registry.weights_of.remote(version)
            if refs[0] is None:
                raise KeyError(f"RM version {version} is not published (kept: {keep})")
            return await refs[0], keep

        state_dict, keep = await until_answered(weights, f"fetching RM version {version}", self.retry_for_s)
        await asyncio.to_thread(self.rm.restore, version, state_dict)
        dropped = self.rm.retire(set(keep) | {version})
        logger.info("replica %d holds RM version %d%s", os.getpid(), version,
                    f"; dropped {dropped}" if dropped else "")
