"""The one RM scorer: logits and P(correct) of (question, reference, completion) triples, by weights version.

The package builds it two ways: `RMScorer.load(path)`, a checkpoint (`cli.eval_verifier`, `verifyrm score`, the lab's
probes, the report, the reward service without --learn), and `RMScorer.of_trainer`, the weights a learner trains.
Offline it holds one version, the checkpoint's. The reward service holds several: version 0 is the RM it started
from (or the version its checkpoint recorded), and every learner update publishes the next. Scoring never runs on
the weights being trained: `publish` copies the trained weights into a scoring copy between batches, so a batch is
scored by one version from start to end. Older versions are kept while an open GRPO group is pinned to them
(`serve/groups.py`) and then dropped (`retire`), so memory holds the latest version plus the few that groups still
use; a checkpoint keeps those few too, and a restart `restore`s them.

The checkpoint is any one-logit sequence classifier that `rm.model.load_rm` accepts (a VerifyRM export, or e.g. the
tiny Qwen2 RM). Its input is the RM template (`algo/template.py`) in the version its config records (`CONFIG_KEY`),
else the version given (default: the current one); asking for a version other than the recorded one is an error.
Scoring is `rm.model.score_logits` (eval mode, no gradients, right-padded micro-batches), as in the RL-time RM actor;
P(correct) is `algo.rewards.probability_correct`, the package's one sigmoid. On CPU each call runs with the intra-op
thread count that scores its number of rows fastest (`runtime.cpu_threads.ThreadChoice`: a lone request on one
thread, a full batch on all).

Tokenizers by reader: a fast (Rust) tokenizer changes its truncation state inside a call, so two threads encoding
with one object fail with "Already borrowed". Each reader (`SCORING`, the service's scoring lane; `PROBE`, the
probe suite read in the learner thread, `serve/probing.py`) encodes with its own copy, made from a copy nobody
encodes with; a reader is one thread at a time.
"""

import contextlib
import copy
import threading
from collections.abc import Sequence

import torch

from cooper_openrlhf.algo.rewards import probability_correct
from cooper_openrlhf.rm.model import load_rm, score_logits, usable_max_length
from cooper_openrlhf.runtime.cpu_threads import ThreadChoice

Item = tuple[int, str, str, str]  # (version, question, reference, completion)
SCORING, PROBE = "scoring", "probe"  # readers, each with its own tokenizer (module docstring)


class RMScorer:
    """RM logits of (question, reference, completion) triples on the weights of a version; see the module docstring.

    max_length: tokens per input (`RMScorer.load`: None is the length the export records, else
    `rm.model.DEFAULT_RM_MAX_LENGTH`), capped at the backbone's position limit; longer inputs are cut.
    """

    def __init__(self, model, tokenizer, *, max_length: int, template_version: str, batch_size: int,
                 version: int = 0):
        # Copies of its own (module docstring): the caller's tokenizer may be encoding in another thread (the learner's).
        self._pristine = copy.deepcopy(tokenizer)  # never encodes: what each reader's copy is made from
        self._tokenizers = {SCORING: copy.deepcopy(tokenizer)}
        self.max_length, self.template_version = max_length, template_version
        self.batch_size = batch_size
        model.eval()
        self.models = {version: model}
        self.latest = version
        self._spare = None  # a retired copy, reused by the next publish instead of a new deepcopy
        self._lock = threading.Lock()  # publish/retire (learner thread) against the scoring thread's lookups
        on_cpu = all(p.device.type == "cpu" for p in model.parameters())
        self.threads = ThreadChoice() if on_cpu else None  # a GPU forward's speed does not depend on CPU threads

    @classmethod
    def load(cls, model_path: str, device: str = "cpu", max_length: int | None = None, batch_size: int = 8,
             template_version: str | None = None, dtype: torch.dtype = torch.float32, version: int = 0) -> "RMScorer":
        """The RM checkpoint at `model_path` (`rm.model.load_rm`, weights in `dtype` on `device`) as `version`."""
        model, tokenizer, recorded_version = load_rm(model_path, dtype=dtype)
        if template_version is not None and template_version != recorded_version:
            raise ValueError(f"{model_path} was trained with template {recorded_version!r}, not {template_version!r}")
        model = model.to(device)
        return cls(model, tokenizer, max_length=usable_max_length(model, max_length),
                   template_version=recorded_version, batch_size=batch_size, version=version)

    @classmethod
    def of_trainer(cls, trainer, *, batch_size: int, version: int = 0, copy_weights: bool = False) -> "RMScorer":
        """The weights an `rm.pairwise_update.RMTrainer` trains, as `version`, read with the trainer's tokenizer,
        length and template. `copy_weights`: score a copy (a service scores while the learner trains in place, and
        `publish` moves each update into it); without, the trained module itself (read between updates only)."""
        module = trainer.model.module
        return cls(copy.deepcopy(module) if copy_weights else module, trainer.tokenizer, max_length=trainer.max_length,
                   template_version=trainer.template_version, batch_size=batch_size, version=version)

    @property
    def tokenizer(self):
        """The scoring lane's tokenizer."""
        return self._tokenizers[SCORING]

    def tokenizer_of(self, reader: str):
        """`reader`'s own tokenizer, copied on its first call (module docstring)."""
        with self._lock:
            if reader not in self._tokenizers:
                self._tokenizers[reader] = copy.deepcopy(self._pristine)
            return self._tokenizers[reader]

    @property
    def model(self):
        """The latest version's weights."""
        return self.model_of(self.latest)

    def model_of(self, version: int):
        with self._lock:
            if version not in self.models:
                raise KeyError(f"RM version {version} is no longer kept (latest {self.latest}, kept "
                               f"{sorted(self.models)})")
            return self.models[version]

    # ---------------------------------------------------------------------------------------- scoring
    def logits(self, questions: Sequence[str], references: Sequence[str], completions: Sequence[str],
               version: int | None = None, reader: str = SCORING) -> list[float]:
        """Raw RM logits of each triple, in input order, on `version`'s weights (None: the latest), encoded with
        `reader`'s tokenizer."""
        model = self.model_of(self.latest if version is None else version)
        tokenizer = self.tokenizer_of(reader)
        with self.threads.running(min(len(questions), self.batch_size)) if self.threads else contextlib.nullcontext():
            return score_logits(model, tokenizer, questions, references, completions, max_length=self.max_length,
                                template_version=self.template_version, batch_size=self.batch_size)

    def score(self, questions: Sequence[str], references: Sequence[str], completions: Sequence[str],
              version: int | None = None) -> list[float]:
        """P(correct) = sigmoid(logit) in [0, 1] of each triple, in input order."""
        logits = self.logits(questions, references, completions, version)  # Python floats, already off the device
        return probability_correct(torch.tensor(logits, dtype=torch.float64, device="cpu")).tolist()

    def logits_of(self, items: list[Item], reader: str = SCORING) -> list[float]:
        """Logits of (version, question, reference, completion) items in input order; items of one version are
        scored together, on that version's weights (the service's batches mix the versions of open groups)."""
        logits = [0.0] * len(items)
        for version in sorted({item[0] for item in items}):
            index = [i for i, item in enumerate(items) if item[0] == version]
            scored = self.logits([items[i][1] for i in index], [items[i][2] for i in index],
                                 [items[i][3] for i in index], version, reader)
            for i, logit in zip(index, scored):
                logits[i] = logit
        return logits

    # --------------------------------------------------------------------------------------- versions
    @torch.no_grad()
    def publish(self, trained_module) -> int:
        """A new version with `trained_module`'s weights (a copy: training goes on in place); returns its number."""
        with self._lock:
            latest, fresh, self._spare = self.models[self.latest], self._spare, None
        fresh = fresh if fresh is not None else copy.deepcopy(latest)
        fresh.load_state_dict(trained_module.state_dict())
        fresh.eval()
        with self._lock:
            self.latest += 1
            self.models[self.latest] = fresh
            return self.latest

    @torch.no_grad()
    def restore(self, version: int, state_dict: dict) -> None:
        """Hold `version` again: an older one a checkpoint kept because an open group is pinned to it, or (a
        replica of `serve/replicated`) one published elsewhere, which becomes the latest when it is newer."""
        with self._lock:
            latest = self.models[self.latest]
        model = copy.deepcopy(latest)
        model.load_state_dict(state_dict)
        model.eval()
        with self._lock:
            self.models[version] = model
            self.latest = max(self.latest, version)

    def versions(self) -> set[int]:
        with self._lock:
            return set(self.models)

    def retire(self, in_use: set[int]) -> list[int]:
        """Drop the versions that are neither the latest nor in `in_use`; returns the dropped ones."""
        with self._lock:
            dropped = [v for v in self.models if v != self.latest and v not in in_use]
            for version in dropped:
                self._spare = self.models.pop(version)
            return dropped
