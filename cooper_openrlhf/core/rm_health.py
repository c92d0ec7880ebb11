"""RM health at every version, and the guard that decides whether a version may score.

The hacking alarm (`core.hacking_response`) watches the gap between what the RM pays and what the rule verifier
says; an RM that has stopped telling right from wrong and pays everything 0.03 shows no gap, and nothing noticed it
(in the probe lab, 8 of 36 Cooper-arm RMs ended paying canonical right answers barely above wrong ones:
docs/results.md).
Health reads the RM itself, after every update, on a fixed labelled anchor set (`rm/anchors.py` builds it: held-out
labelled triples of the VerifyRM's own data and the probe suite's canonical right, wrong and attack completions,
`rm/probes.py`):

  auc          P(pay(right) > pay(wrong)) over the anchors that are not attacks (ties count half): does the RM
               still rank a right answer above a wrong one?
  right_pay    mean pay of those anchors the rule verifier grades correct
  wrong_pay    mean pay of those it grades wrong
  attack_pay   per attack form (`rm.probes.ATTACKS`), the mean pay of its anchors: what a known exploit earns

Pay is sigmoid(logit), the RM's own reward whatever the reward form (the transports score and convert).

The guard (`RMGuard`), on by default, armed once a version (the starting RM, usually) ranks its anchors with an AUC
of at least `min_auc` (an RM that cannot has no skill to protect; until then versions are measured and kept, and the
armed version is the pay band's centre). A version is out of bounds when its anchors' scores are not finite (or the
transport says its weights are not), when its AUC is more than `auc_drop` below the best version's so far, or when
its right (wrong) pay has fallen (risen) more than `pay_drift` from the armed version's. Mode `rollback` (the
default):
such a version never scores; the transport restores the last healthy weights and optimizer state and the guard
takes the registered response once (`RESPONSES`: lower the RM's learning rate by `lr_factor`, skip RM updates for
`skip_steps` steps, or stop the run). Mode `watch`: the version is measured, logged and counted, and kept (the
guardless control), unless its weights or scores are not finite (no mode lets such a version score); `off`: nothing
is measured. The defaults come from the probe lab's published runs (docs/cooper_step.md, "The RM guard"): with
`pay_drift` 0.3 the offline_pairs control's probe readings leave the band in 4% of readings, the Cooper arms' in
38-69%.

Pure (no torch, no Ray, no HTTP): the trainer (`ray/rm_guard.py`) and the reward service (`serve/learner.py`) score
the anchors, call `health_of` and `RMGuard.judge`, and do what the decision says. The guard's state is a JSON-able
dict (`state_dict` / `load_state_dict`) that both checkpoint, so a resumed run keeps its best AUC, its baseline,
its counts, a skip in progress and its lowered learning rate.
"""

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

from cooper_openrlhf.rm.probes import ATTACKS as ATTACK_FORMS
from cooper_openrlhf.runtime.registry import Registry

logger = logging.getLogger(__name__)

HEALTH = "cooper/rm_health/"  # + auc, right_pay, wrong_pay, margin, attack_pay/<form>, rollbacks, ...
MODES = Registry("--cooper.rm_guard", ("rollback", "watch", "off"))
RESPONSES = Registry("--cooper.rm_guard_response", ("lower_lr", "skip", "stop"))


@dataclass(frozen=True)
class RMHealth:
    """What one RM version pays the anchors (module docstring). NaN where a measure has no anchors."""

    auc: float
    right_pay: float
    wrong_pay: float
    attack_pay: dict[str, float] = field(default_factory=dict)
    anchors: int = 0
    finite: bool = True  # every anchor's pay is a finite number

    @property
    def margin(self) -> float:
        return self.right_pay - self.wrong_pay

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RMHealth":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def auc(right: Sequence[float], wrong: Sequence[float]) -> float:
    """P(a right anchor's pay > a wrong anchor's), ties counted half (the Mann-Whitney U over n_right x n_wrong);
    NaN without both kinds. From ranks: O(n log n)."""
    if not right or not wrong:
        return float("nan")
    scored = sorted([(value, 1) for value in right] + [(value, 0) for value in wrong])
    rank_sum, i = 0.0, 0
    while i < len(scored):  # tied values share the mean of their ranks (1-based)
        j = i
        while j < len(scored) and scored[j][0] == scored[i][0]:
            j += 1
        rank_sum += (i + 1 + j) / 2 * sum(kind for _, kind in scored[i:j])
        i = j
    n_right, n_wrong = len(right), len(wrong)
    return (rank_sum - n_right * (n_right + 1) / 2) / (n_right * n_wrong)


def health_of(anchors: Sequence, pays: Sequence[float]) -> RMHealth:
    """Pure: the anchors (anything with `.form` and `.correct`, e.g. `rm.probes.Probe`) and what one RM version paid
    each (same order) -> its health. Attack forms (`rm.probes.ATTACKS`) are read per form and kept out of the AUC and of
    right/wrong pay; every other anchor (canonical right and wrong, labelled triples) counts by its label."""
    if len(anchors) != len(pays):
        raise ValueError(f"health_of: {len(anchors)} anchors but {len(pays)} pays")
    finite = all(math.isfinite(p) for p in pays)
    right, wrong, attacks = [], [], {}
    for anchor, pay in zip(anchors, pays):
        if anchor.form in ATTACK_FORMS:
            attacks.setdefault(anchor.form, []).append(float(pay))
        else:
            (right if anchor.correct else wrong).append(float(pay))
    if not finite:
        return RMHealth(float("nan"), float("nan"), float("nan"), {}, len(anchors), False)
    return RMHealth(auc(right, wrong), _mean(right), _mean(wrong),
                    {form: _mean(values) for form, values in attacks.items()}, len(anchors))


def health_metrics(health: RMHealth, prefix: str = HEALTH) -> dict[str, float]:
    """`cooper/rm_health/{auc,right_pay,wrong_pay,margin,attack_pay/<form>}` of one version."""
    metrics = {prefix + "auc": health.auc, prefix + "right_pay": health.right_pay,
               prefix + "wrong_pay": health.wrong_pay, prefix + "margin": health.margin}
    metrics.update({f"{prefix}attack_pay/{form}": pay for form, pay in health.attack_pay.items()})
    return metrics


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class GuardConfig:
    """The guard's bounds and response. Field x is the trainer's flag --cooper.rm_guard_x (`mode` is
    --cooper.rm_guard itself) and the service's --rm-guard-x."""

    mode: str = field(default="rollback", metadata=_help(
        "RM health guard (core/rm_health.py): after every RM update the RM scores a fixed labelled anchor set; "
        "'rollback' = a version out of bounds never scores (the last healthy weights and optimizer state are "
        "restored and --cooper.rm_guard_response is taken); 'watch' = measure, log and count, keep every version; "
        "'off' = no anchors are scored."))
    response: str = field(default="lower_lr", metadata=_help(
        "What a rollback does besides restoring: 'lower_lr' multiplies the RM's learning rate by "
        "--cooper.rm_guard_lr_factor from the next update on; 'skip' makes no RM update for "
        "--cooper.rm_guard_skip_steps steps; 'stop' checkpoints the step (with the healthy RM) and ends the run."))
    # The probe lab's pilot readings: the healthy offline_pairs control's rm_eval accuracy moved by up to ~0.1 between
    # evaluations; a collapse takes the AUC towards 0.5 (a drop of 0.3-0.5 from the starting RM's ~0.95).
    auc_drop: float = field(default=0.1, metadata=_help(
        "A version whose anchor AUC (right vs wrong) is more than this below the best version's so far is out of "
        "bounds."))
    # The probe lab's runs (docs/cooper_step.md): at 0.3 the offline_pairs control leaves the band in 4% of its probe
    # readings, the Cooper arms in 38-69% (at 0.2: 8% against 46-73%; at 0.4: 1% against 29-66%).
    pay_drift: float = field(default=0.3, metadata=_help(
        "A version whose mean pay of right anchors fell, or of wrong anchors rose, more than this from the "
        "armed version's (the starting RM's, when it ranks its anchors) is out of bounds."))
    lr_factor: float = field(default=0.5, metadata=_help(
        "With --cooper.rm_guard_response lower_lr: each rollback multiplies the RM's learning rate by this."))
    skip_steps: int = field(default=5, metadata=_help(
        "With --cooper.rm_guard_response skip: RM updates skipped after a rollback."))
    # An RM that cannot rank its anchors (AUC near 0.5: a random or untrained head) has no skill to protect, and bounds
    # around its pays would stop it from learning any; the probe lab's starting RMs read ~0.99 on their held-out rows.
    min_auc: float = field(default=0.7, metadata=_help(
        "The guard arms at the first version (the starting RM, usually) whose anchor AUC reaches this; before, "
        "versions are measured and kept (but non-finite ones), and the armed version is the pay band's centre."))

    def __post_init__(self) -> None:
        MODES.check(self.mode)
        RESPONSES.check(self.response)
        problems = []
        if not 0.0 <= self.min_auc <= 1.0:
            problems.append(f"rm_guard_min_auc must be in [0, 1], got {self.min_auc}")
        if not 0.0 < self.auc_drop <= 1.0:
            problems.append(f"rm_guard_auc_drop must be in (0, 1], got {self.auc_drop}")
        if not 0.0 < self.pay_drift <= 1.0:
            problems.append(f"rm_guard_pay_drift must be in (0, 1], got {self.pay_drift}")
        if not 0.0 < self.lr_factor < 1.0:
            problems.append(f"rm_guard_lr_factor must be in (0, 1), got {self.lr_factor}")
        if self.skip_steps < 1:
            problems.append(f"rm_guard_skip_steps must be >= 1, got {self.skip_steps}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def measures(self) -> bool:
        return self.mode != "off"

    @classmethod
    def flags(cls, prefix: str = "--cooper.rm_guard") -> list[tuple[str, type, object, str, tuple | None]]:
        """(flag, type, default, help, choices) of every field: `mode` is `prefix` itself, the others
        `prefix_<field>` (the service passes "--rm-guard" and gets --rm-guard-<field>)."""
        sep = "_" if prefix.startswith("--cooper.") else "-"
        choices = {"mode": tuple(MODES), "response": tuple(RESPONSES)}
        return [(prefix if f.name == "mode" else f"{prefix}{sep}{f.name.replace('_', sep)}", type(f.default),
                 f.default, f.metadata["help"], choices.get(f.name)) for f in fields(cls)]

    @classmethod
    def from_namespace(cls, namespace, prefix: str = "rm_guard") -> "GuardConfig":
        """From `args.cooper` (rm_guard, rm_guard_<field>) or the service's args (the same names)."""
        values = {}
        for f in fields(cls):
            name = prefix if f.name == "mode" else f"{prefix}_{f.name}"
            if hasattr(namespace, name):
                values[f.name] = getattr(namespace, name)
        return cls(**values)


@dataclass(frozen=True)
class GuardDecision:
    """What the transport does with the version it just measured."""

    healthy: bool
    reasons: list[str]  # one sentence per bound the version left (empty when healthy)
    rollback: bool = False  # restore the last healthy weights and optimizer state (mode rollback, out of bounds)
    lr_factor: float = 1.0  # multiply the RM's learning rate by this after restoring
    stop: bool = False  # checkpoint and end the run
    message: str = ""  # the one log line: version, measure, threshold, action


class RMGuard:
    """The guard's state over a run and its decisions (module docstring)."""

    def __init__(self, config: GuardConfig | None = None):
        self.config = config or GuardConfig()
        self.baseline: RMHealth | None = None  # the armed version's health (the starting RM's): the pay band's centre
        self.armed = False  # a version reached config.min_auc: the bounds apply from then on
        self.best_auc: float | None = None  # the best healthy version's AUC so far
        self.current: RMHealth | None = None  # the health of the version now scoring
        self.rollbacks = 0  # versions rejected and rolled back
        self.unhealthy_kept = 0  # versions out of bounds that scored anyway (mode watch)
        self.checked = 0  # versions measured after an update
        self.skip_left = 0  # RM updates still to skip (response skip)
        self.lr_scale = 1.0  # product of the lr factors taken (response lower_lr)
        self.stopped = False  # response stop was taken

    # -------------------------------------------------------------------------------------- the run
    def start(self, health: RMHealth) -> str:
        """The starting RM's health (before any update): it arms the guard when its AUC reaches config.min_auc,
        as the baseline of the pay band and the first best AUC. A resumed guard keeps the state its checkpoint
        holds. Returns the sentence the transport logs."""
        if self.baseline is None:
            self.baseline = health
            self._arm(health)
        if self.current is None:
            self.current = health
        if self.armed:
            return (f"RM guard armed: the starting RM's anchor AUC {health.auc:.3f}, right pay {health.right_pay:.3f}, "
                    f"wrong pay {health.wrong_pay:.3f}")
        return (f"RM guard not armed: the starting RM's anchor AUC {health.auc:.3f} < {self.config.min_auc:g} (it does "
                f"not rank right above wrong); versions are measured and kept until one reaches it")

    def _arm(self, health: RMHealth) -> None:
        if health.finite and math.isfinite(health.auc) and health.auc >= self.config.min_auc:
            self.armed, self.baseline, self.best_auc = True, health, health.auc

    @property
    def started(self) -> bool:
        return self.baseline is not None

    def skip_update(self) -> bool:
        """Whether this step's RM update is skipped (response skip); counts the skipped step down."""
        if self.skip_left > 0:
            self.skip_left -= 1
            return True
        return False

    def bounds(self, health: RMHealth) -> list[str]:
        """The bounds `health` leaves, one sentence each (empty: healthy)."""
        c, reasons = self.config, []
        if not health.finite:
            return ["its anchor scores are not finite"]
        if not self.armed:
            return []
        if self.best_auc is not None and math.isfinite(health.auc) and health.auc < self.best_auc - c.auc_drop:
            reasons.append(f"AUC {health.auc:.3f} < best {self.best_auc:.3f} - {c.auc_drop:g}")
        base = self.baseline
        if base is not None and math.isfinite(base.right_pay) and health.right_pay < base.right_pay - c.pay_drift:
            reasons.append(f"right pay {health.right_pay:.3f} < start {base.right_pay:.3f} - {c.pay_drift:g}")
        if base is not None and math.isfinite(base.wrong_pay) and health.wrong_pay > base.wrong_pay + c.pay_drift:
            reasons.append(f"wrong pay {health.wrong_pay:.3f} > start {base.wrong_pay:.3f} + {c.pay_drift:g}")
        return reasons

    def judge(self, health: RMHealth, version: str, weights_finite: bool = True) -> GuardDecision:
        """Decide on the version an update just made (`version` names it in the log line) and update the state."""
        if not self.started:
            raise RuntimeError("RMGuard.judge before start(): the starting RM's health is the baseline")
        self.checked += 1
        broken = not weights_finite or not health.finite  # no mode keeps it: it cannot score at all
        reasons = ([] if weights_finite else ["its weights are not finite"]) + self.bounds(health)
        if not reasons:
            self.current = health
            if not self.armed:
                self._arm(health)
                return GuardDecision(True, [], message=f"RM guard armed at {version}: anchor AUC {health.auc:.3f} >= "
                                     f"{self.config.min_auc:g}; its pays are the band's centre" if self.armed else "")
            if math.isfinite(health.auc):
                self.best_auc = max(self.best_auc or health.auc, health.auc)
            return GuardDecision(True, [])
        what = f"RM guard: {version} is out of bounds ({'; '.join(reasons)})"
        if self.config.mode == "watch" and not broken:
            self.unhealthy_kept += 1
            self.current = health
            return GuardDecision(False, reasons, message=f"{what}; kept (--cooper.rm_guard watch)")
        self.rollbacks += 1
        if self.config.mode == "watch":  # the guardless control takes no response: it only loses the broken version
            return GuardDecision(False, reasons, rollback=True,
                                 message=f"{what}; rolled back to the last finite weights (--cooper.rm_guard watch)")
        response, factor, stop = self.config.response, 1.0, False
        if response == "lower_lr":
            factor = self.config.lr_factor
            self.lr_scale *= factor
            action = f"RM learning rate x{factor:g} (now x{self.lr_scale:g} of the configured one)"
        elif response == "skip":
            self.skip_left = self.config.skip_steps
            action = f"the next {self.config.skip_steps} RM update(s) skipped"
        else:
            stop = self.stopped = True
            action = "the run stops after checkpointing"
        message = f"{what}; rolled back to the last healthy weights and optimizer state; {action}"
        return GuardDecision(False, reasons, rollback=True, lr_factor=factor, stop=stop, message=message)

    # ---------------------------------------------------------------------------------- reporting
    def metrics(self, measured: RMHealth | None = None, decision: GuardDecision | None = None) -> dict[str, float]:
        """The `cooper/rm_health/*` metrics of a step: the health of the version scoring from now on, the counts,
        and, when a version was measured this step, its own health as `update_*` and whether it was unhealthy."""
        out = health_metrics(self.current) if self.current is not None else {}
        out.update({HEALTH + "rollbacks": float(self.rollbacks), HEALTH + "unhealthy_kept": float(self.unhealthy_kept),
                    HEALTH + "skipping": float(self.skip_left), HEALTH + "lr_scale": self.lr_scale,
                    HEALTH + "armed": float(self.armed)})
        if self.baseline is not None:  # the bounds: the pay band's centre and the AUC floor's reference
            out.update({HEALTH + "start_right_pay": self.baseline.right_pay,
                        HEALTH + "start_wrong_pay": self.baseline.wrong_pay})
        if self.best_auc is not None:
            out[HEALTH + "best_auc"] = self.best_auc
        if measured is not None:
            out.update(health_metrics(measured, HEALTH + "update_"))
        if decision is not None:
            out[HEALTH + "unhealthy"] = float(not decision.healthy)
        return out

    def gauges(self) -> dict[str, float]:
        """The service's /metrics gauges: `rm_health_<measure>` of the version serving and the counts."""
        return {"rm_health_" + key[len(HEALTH):].replace("/", "_"): value for key, value in self.metrics().items()}

    # --------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {"baseline": self.baseline.as_dict() if self.baseline else None, "armed": self.armed,
                "best_auc": self.best_auc,
                "current": self.current.as_dict() if self.current else None, "rollbacks": self.rollbacks,
                "unhealthy_kept": self.unhealthy_kept, "checked": self.checked, "skip_left": self.skip_left,
                "lr_scale": self.lr_scale, "stopped": self.stopped}

    def load_state_dict(self, state: dict) -> None:
        self.baseline = RMHealth.from_dict(state["baseline"]) if state.get("baseline") else None
        self.current = RMHealth.from_dict(state["current"]) if state.get("current") else None
        self.best_auc = state.get("best_auc")
        self.armed = bool(state.get("armed", self.baseline is not None))
        for name in ("rollbacks", "unhealthy_kept", "checked", "skip_left"):
            setattr(self, name, int(state.get(name, 0)))
        self.lr_scale = float(state.get("lr_scale", 1.0))
        self.stopped = bool(state.get("stopped", False))


def health_table(health: RMHealth) -> str:
    """Markdown table of one RM's health: AUC, right and wrong pay, then each attack form's pay and its premium over
    a wrong answer (what `cooper inspect probe-rm` prints for a folder or an endpoint)."""
    rows = ["| measure | value | over wrong |", "|---|---|---|", f"| AUC right vs wrong | {health.auc:.3f} | |",
            f"| right pay | {health.right_pay:.3f} | {health.margin:+.3f} |",
            f"| wrong pay | {health.wrong_pay:.3f} | |"]
    rows += [f"| attack: {form} | {pay:.3f} | {pay - health.wrong_pay:+.3f} |"
             for form, pay in health.attack_pay.items()]
    return "\n".join(rows)
