"""Does the prompt distillation work? A student distilled online from the teacher, measured on
held-out scenes against the number of LoRA steps (``scripts/bench.py distill``).

    from drivemind.evaluation.distill import DistillConfig, run
    result = run(DistillConfig(lora_steps=1500))  # parse_rate, agreement, curve, ...

**Scenes.** The lite simulator drives ``towns`` x ``densities`` x ``drivers`` (the reward-quality
set's drivers: the autopilot, the perturbed autopilot, random actions) for ``env_steps`` steps
each and keeps every ``every``-th frame as a :class:`~drivemind.vlm.prompts.PromptRequest` (the
BEV masks the student sees and the facts only the privileged teacher reads). Training scenes come
from seeds ``train_seed``..., held-out scenes from ``heldout_seed``... (disjoint episodes, the
same towns). In a run most frames show the same quiet situation; DriveMind calls its generator
on *novel* frames, so the training stream is capped per teacher answer: no one (present, ideal)
pair takes more than ``max_share`` of it (the surplus frames are dropped at random). The
held-out scenes are kept as driven (no cap), so the majority baseline below is honest.

**Distillation** (DriveMind App. B.4, online): for each training scene in turn the teacher
writes its JSON and the student takes one LoRA step on it (batch 1); each scene is used once
(``lora_steps`` <= the training scenes, else an error says to drive more). After every
``eval_every`` steps (and at step 0) the student answers every held-out scene greedily:

- ``parse_rate``: the share of answers :func:`~drivemind.vlm.prompts.parse_prompt_json` accepts;
- ``agreement``: the share whose present *and* ideal prompts equal the teacher's on the same
  scene (whitespace-normalised; an unparseable answer disagrees); ``agreement_present`` and
  ``agreement_ideal`` each on its own;
- ``majority_agreement``: the same for a constant answer, the training stream's most frequent
  teacher pair: the bar an image-blind student clears;
- ``best_constant_agreement``: the held-out scenes' own most frequent teacher pair's share, the
  best any constant answer could score (chosen with hindsight; with a long capped stream the
  stream's majority pair need not be the held-out one's, so this is the bar to beat).

The student sees the image and, when configured, the ego's own measurements (``measurements``:
its speed as a number in the prompt; the teacher reads ground truth, and one BEV frame does not
show the ego's speed), so agreement is bounded by what those show.
"""

from __future__ import annotations

import collections
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..facts import FACT_KEYS

from .reward_quality import DRIVERS, check_drive_plan


@dataclass(frozen=True)
class DistillConfig:
    towns: tuple = ("grid", "curves", "avenue")
    densities: tuple = ("regular", "dense")
    drivers: tuple = DRIVERS
    env_steps: int = 900  # env steps per town x density x driver (training drive)
    heldout_env_steps: int = 150  # the same, held-out drive
    every: int = 3  # keep every n-th frame
    train_seed: int = 0
    heldout_seed: int = 20_000
    max_share: float = 0.2  # cap of one teacher answer in the training stream
    lora_steps: int = 1500
    eval_every: int = 300
    eval_scenes: int = 40  # held-out scenes answered at each point of the curve
    seed: int = 0  # the student's initial weights and the stream's order
    bev: str = "cpu"
    student: dict = field(default_factory=dict)  # make_generator("student_smolvlm", **student)

    def __post_init__(self):
        check_drive_plan(self.towns, self.densities, self.drivers)
        for name in ("env_steps", "heldout_env_steps", "every", "lora_steps", "eval_every",
                     "eval_scenes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not 0 < self.max_share <= 1:
            raise ValueError(f"max_share must be in (0, 1], got {self.max_share!r}")
        if self.train_seed == self.heldout_seed:
            raise ValueError("train_seed and heldout_seed must differ (held-out scenes are unseen)")


def collect_scenes(towns, densities, drivers, env_steps: int, every: int, seed: int,
                   bev: str = "cpu") -> list:
    """Every ``every``-th frame the lite simulator drives (module docstring), as PromptRequests
    with the BEV masks and the step's facts. Deterministic for its arguments."""
    from ..envs import DriveEnv
    from ..vlm.prompts import PromptRequest
    from .reward_quality import _drive

    out = []
    combos = [(t, d, dr) for t in towns for d in densities for dr in drivers]
    for k, (town, density, driver) in enumerate(combos):
        env = DriveEnv(town, density, bev=bev)
        rng = np.random.default_rng([seed, k])
        for t, (_, _, obs, info, ended) in enumerate(_drive(env, driver, int(env_steps), rng)):
            if ended == "cut" or t % every:
                continue
            out.append(PromptRequest(facts={key: float(info[key]) for key in FACT_KEYS},
                                     bev=np.array(obs["bev"], copy=True), step=t))
        env.close()
    return out


def _pair(teacher, request) -> tuple[str, str]:
    p = teacher.prompts(request.facts)
    return p.present, p.ideal


def cap_share(scenes: list, teacher, max_share: float, rng: np.random.Generator) -> list:
    """``scenes`` shuffled, with no teacher (present, ideal) pair above ``max_share`` of the
    result (surplus frames of the frequent pairs dropped at random)."""
    groups = collections.defaultdict(list)
    for s in scenes:
        groups[_pair(teacher, s)].append(s)
    sizes = {k: len(v) for k, v in groups.items()}
    # the largest cap c with c <= max_share * (sum of min(size, c)) over the groups
    cap = max(sizes.values())
    while cap > 1 and cap > max_share * sum(min(n, cap) for n in sizes.values()):
        cap -= 1
    kept = []
    for k in sorted(groups):
        g = groups[k]
        idx = rng.permutation(len(g))[:cap]
        kept.extend(g[i] for i in sorted(idx))
    return [kept[i] for i in rng.permutation(len(kept))]


def evaluate(student, teacher, scenes: list, majority: tuple[str, str] | None = None) -> dict:
    """parse_rate, agreement (present and ideal), agreement_present, agreement_ideal and, with
    ``majority`` (a constant answer), majority_agreement over ``scenes``; ``malformed_example``:
    the first unparseable answer (cut to 120 characters)."""
    from ..vlm.prompts import MalformedPrompt, parse_prompt_json

    n = len(scenes)
    if n == 0:
        raise ValueError("no held-out scenes to evaluate on")
    ok = both = pres = ideal = maj = 0
    example = None
    distinct = set()
    t0 = time.perf_counter()
    for s in scenes:
        target = _pair(teacher, s)
        if majority is not None:
            maj += majority == target
        text = student.generate(s)
        try:
            got = parse_prompt_json(text)
        except MalformedPrompt:
            if example is None:
                example = text[:120]
            continue
        ok += 1
        distinct.add((got.present, got.ideal))
        pres += got.present == target[0]
        ideal += got.ideal == target[1]
        both += (got.present, got.ideal) == target
    out = {"parse_rate": ok / n, "agreement": both / n, "agreement_present": pres / n,
           "agreement_ideal": ideal / n, "distinct_answers": len(distinct),
           "generate_s_per_scene": (time.perf_counter() - t0) / n, "malformed_example": example}
    if majority is not None:
        out["majority_agreement"] = maj / n
    return out


def run(cfg: DistillConfig = DistillConfig(), progress=None, scenes=None) -> dict:
    """Drive the scenes, distil the student online and measure it (module docstring). Returns
    the last point's measures at the top level and the whole curve (``curve``: one dict per
    evaluation, with ``step``, ``loss`` (mean of the steps since the last point) and the
    measures). ``scenes``: ``(train, heldout)`` lists of PromptRequests already driven (what
    :func:`collect_scenes` returns for ``cfg``'s drive plan) instead of driving them again, e.g.
    to compare students on the same scenes."""
    from ..vlm.generators import make_generator
    from ..vlm.prompts import PrivilegedTeacher

    t0 = time.perf_counter()
    # built first: a bad student option fails before the drive
    student = make_generator("student_smolvlm", teacher=None, seed=cfg.seed, **dict(cfg.student))
    teacher = PrivilegedTeacher()
    t_drive = time.perf_counter()
    rng = np.random.default_rng([cfg.seed, 1])
    if scenes is None:
        train_all = collect_scenes(cfg.towns, cfg.densities, cfg.drivers, cfg.env_steps, cfg.every,
                                   cfg.train_seed, cfg.bev)
        heldout_all = collect_scenes(cfg.towns, cfg.densities, cfg.drivers, cfg.heldout_env_steps,
                                     cfg.every, cfg.heldout_seed, cfg.bev)
    else:
        train_all, heldout_all = (list(x) for x in scenes)
    train = cap_share(train_all, teacher, cfg.max_share, rng)
    if len(train) < cfg.lora_steps:
        raise ValueError(f"{cfg.lora_steps} LoRA steps need as many training scenes, but the "
                         f"drive gave {len(train)} after the max_share={cfg.max_share} cap "
                         f"({len(train_all)} before): raise env_steps or lower lora_steps")
    train = train[:cfg.lora_steps]
    ho_idx = np.random.default_rng([cfg.seed, 2]).permutation(len(heldout_all))[:cfg.eval_scenes]
    heldout = [heldout_all[i] for i in sorted(ho_idx)]
    counts = collections.Counter(_pair(teacher, s) for s in train)
    majority = counts.most_common(1)[0][0]
    # the best any constant answer could do on these held-out scenes (chosen with hindsight)
    best_constant = max(collections.Counter(_pair(teacher, s) for s in heldout).values()) / len(heldout)
    collect_s = time.perf_counter() - t_drive

    curve, losses, learn_s = [], [], 0.0

    def point(step):
        m = evaluate(student, teacher, heldout, majority)
        m["best_constant_agreement"] = best_constant
        m.update(step=step, loss=float(np.mean(losses)) if losses else None)
        losses.clear()
        curve.append(m)
        if progress is not None:
            progress(m)

    point(0)
    for i, s in enumerate(train, 1):
        t1 = time.perf_counter()
        losses.append(student.learn(s, teacher.generate(s)))
        learn_s += time.perf_counter() - t1
        if i % cfg.eval_every == 0 or i == len(train):
            point(i)
    last = curve[-1]
    out = {k: last[k] for k in ("parse_rate", "agreement", "agreement_present", "agreement_ideal",
                                "majority_agreement", "best_constant_agreement",
                                "distinct_answers")}
    first_ok = next((p["step"] for p in curve if p["parse_rate"] >= 0.9), None)
    out.update(lora_steps=len(train), steps_to_parse_0_9=first_ok, curve=curve,
               train_scenes=len(train), train_scenes_before_cap=len(train_all),
               train_distinct_answers=len(counts), heldout_scenes=len(heldout),
               heldout_pool=len(heldout_all), learn_s_per_step=learn_s / max(len(train), 1),
               collect_s=collect_s, seconds=time.perf_counter() - t0,
               student=repr(student), config={k: (list(v) if isinstance(v, tuple) else v)
                                              for k, v in asdict(cfg).items()})
    return out


def plot_curve(curve: list[dict], path, title: str = "") -> str:
    """PNG of parse rate, agreement (both prompts, each prompt) and the majority baseline against
    the number of LoRA steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in curve]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(steps, [p["parse_rate"] for p in curve], "o-", label="parse rate")
    ax.plot(steps, [p["agreement"] for p in curve], "s-", label="agreement (present and ideal)")
    ax.plot(steps, [p["agreement_present"] for p in curve], ":", label="agreement, present")
    ax.plot(steps, [p["agreement_ideal"] for p in curve], ":", label="agreement, ideal")
    if curve and curve[0].get("majority_agreement") is not None:
        ax.axhline(curve[0]["majority_agreement"], color="grey", ls="--",
                   label="majority answer (image-blind)")
    if curve and curve[0].get("best_constant_agreement") is not None:
        ax.axhline(curve[0]["best_constant_agreement"], color="black", ls=":",
                   label="best constant answer (hindsight)")
    ax.set_xlabel("LoRA steps (one per teacher-labelled scene)")
    ax.set_ylabel("share of held-out scenes")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "student_smolvlm distilled online from the privileged teacher")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
