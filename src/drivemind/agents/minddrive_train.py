"""MindDrive's training stages and run directory (``python scripts/train.py algo=minddrive``).

1. **SFT**: the env's autopilot (``env.expert_action()``) drives ``algo.sft_steps`` steps; each
   step's meta-action is derived from its behaviour (speed change over ``algo.action_horizon`` s,
   route command) and its set-point is its speed that far ahead. Both experts are fine-tuned on
   them (decision: next-token loss of the meta-action after the scene prompt; action: squared
   error of the set-point). The result is saved as ``checkpoints/sft_reference.zip`` and kept as
   the frozen reference adapter.
2. **PPO in language space** on the decision expert for ``total_timesteps`` env steps: every
   ``decision_every`` steps a meta-action is sampled from the distribution over the fixed set,
   the action expert gives the set-point, the controller drives; reward +1 on arrival, -1 on a
   penalty event (:func:`~drivemind.agents.minddrive.event_reward`); clipped surrogate, value
   loss and KL(reference || policy) on the meta-action distribution.

The run directory is the one scripts/train.py uses (config.yaml, obs_signature.json,
checkpoints/ with latest.json, logs/progress.csv and episodes.csv, summary.json) plus
``decisions.jsonl``: the decision log (step, stage, prompt, meta-action, probability). The
agent is not an SB3 algorithm (its policy is a distribution over language candidates, its
rollout holds a meta-action over several env steps), so this loop replaces SB3's ``learn``;
evaluation loads it through the same ``load_policy``.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import torch as th
import yaml

from .minddrive import (META_ACTIONS, MindDriveAgent, MindDriveConfig, derive_meta_action, env_meta,
                        event_reward, gae, kl_ref_policy, ppo_clip_loss, scene_prompt)


# ----------------------------------------------------------------------------- SFT
def collect_expert(env, steps: int, horizon_steps: int, lead_range: float = 50.0):
    """Drive ``env`` (reset here) ``steps`` steps with its autopilot; returns samples
    ``(prompt, meta_action, set_point_m_s)``, one per step that has ``horizon_steps`` steps of
    the same episode after it."""
    base = env.unwrapped
    dt = float(base.sim_cfg.dt)
    samples = []
    obs, info = env.reset()
    ep = [info]

    def label(ep):
        for t in range(len(ep) - horizon_steps):
            f, g = ep[t], ep[t + horizon_steps]
            v0, v1 = f["speed_kmh"] / 3.6, g["speed_kmh"] / 3.6
            samples.append((scene_prompt(f, lead_range),
                            derive_meta_action(v0, v1, f["command"], horizon_steps * dt), v1))

    for _ in range(steps):
        obs, _, term, trunc, info = env.step(base.expert_action())
        ep.append(info)
        if term or trunc:
            label(ep)
            obs, info = env.reset()
            ep = [info]
    label(ep)
    return samples


def sft(agent: MindDriveAgent, samples, epochs: int, batch: int, lr: float, seed: int = 0,
        log=None) -> dict:
    """Fine-tune both adapters (and the action head) on the expert's samples."""
    lm = agent.lm
    lm.train()
    dec = th.optim.Adam(lm.adapter_params("decision"), lr=lr)
    act = th.optim.Adam(lm.adapter_params("action") + list(lm.action_head.parameters()), lr=lr)
    rng = np.random.default_rng(seed)
    last = {}
    for ep in range(epochs):
        order = rng.permutation(len(samples))
        dl, al = [], []
        for i in range(0, len(order), batch):
            b = [samples[j] for j in order[i:i + batch]]
            prompts, metas = [s[0] for s in b], [s[1] for s in b]
            loss = lm.sft_decision_loss(prompts, metas)
            dec.zero_grad()
            loss.backward()
            dec.step()
            target = th.tensor([s[2] / 10.0 for s in b], dtype=th.float32)
            aloss = th.nn.functional.mse_loss(lm.trajectory(prompts, metas), target)
            act.zero_grad()
            aloss.backward()
            act.step()
            dl.append(float(loss.detach()))
            al.append(float(aloss.detach()))
        last = {"sft_epoch": ep + 1, "decision_loss": float(np.mean(dl)), "action_mse": float(np.mean(al))}
        if log is not None:
            log(last)
    lm.eval()
    return last


def add_reference(agent: MindDriveAgent):
    """Freeze a copy of the decision adapter as ``reference`` (the KL anchor)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    lm = agent.lm.lm
    if "reference" not in lm.peft_config:
        lm.add_adapter("reference", lm.peft_config["decision"])
    set_peft_model_state_dict(lm, get_peft_model_state_dict(lm, adapter_name="decision"),
                              adapter_name="reference")
    for n, p in lm.named_parameters():
        if ".reference." in n:
            p.requires_grad_(False)


# ----------------------------------------------------------------------------- PPO
@th.no_grad()
def reference_logp(agent: MindDriveAgent, prompts: list[str], masks=None, chunk: int = 64) -> np.ndarray:
    """The frozen SFT reference's log-probabilities over the meta-actions (len x M), batched
    (``masks``: the allowed meta-actions per prompt, as the policy had them)."""
    out = [agent.lm.decide(prompts[i:i + chunk], adapter="reference",
                           allowed=None if masks is None else np.stack(masks[i:i + chunk]))[0].numpy()
           for i in range(0, len(prompts), chunk)]
    return np.concatenate(out, 0)


def ppo_update(agent: MindDriveAgent, opt, roll: dict, cfg: MindDriveConfig, rng) -> dict:
    lm = agent.lm
    lm.train()
    n = len(roll["prompts"])
    adv = th.tensor(roll["adv"], dtype=th.float32)
    if cfg.normalize_advantage and n > 1 and float(adv.std()) > 1e-8:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ret = th.tensor(roll["ret"], dtype=th.float32)
    acts = th.tensor(roll["actions"])
    old = th.tensor(roll["logp"], dtype=th.float32)
    ref = th.tensor(np.asarray(roll["logp_ref"]), dtype=th.float32)
    params = lm.adapter_params("decision") + list(lm.value_head.parameters())
    stats = {"policy_loss": [], "value_loss": [], "kl_ref": [], "clip_frac": [], "entropy": []}
    for _ in range(cfg.n_epochs):
        order = rng.permutation(n)
        for i in range(0, n, cfg.batch_size):
            idx = order[i:i + cfg.batch_size]
            masks = roll.get("masks")
            logp_all, values = lm.decide([roll["prompts"][j] for j in idx],
                                         allowed=None if masks is None else np.stack([masks[j] for j in idx]))
            logp = logp_all.gather(1, acts[idx][:, None]).squeeze(1)
            pl = ppo_clip_loss(logp, old[idx], adv[idx], cfg.clip_range)
            vl = th.nn.functional.mse_loss(values, ret[idx])
            kl = kl_ref_policy(ref[idx], logp_all)
            loss = pl + cfg.vf_coef * vl + cfg.kl_coef * kl
            opt.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            with th.no_grad():
                ratio = (logp - old[idx]).exp()
                stats["clip_frac"].append(float(((ratio - 1).abs() > cfg.clip_range).float().mean()))
                stats["entropy"].append(float(-(logp_all.exp() * logp_all).sum(-1).mean()))
            stats["policy_loss"].append(float(pl.detach()))
            stats["value_loss"].append(float(vl.detach()))
            stats["kl_ref"].append(float(kl.detach()))
    lm.eval()
    return {k: float(np.mean(v)) for k, v in stats.items()}


# ----------------------------------------------------------------------------- the run
def _csv_row(path: Path, row: dict):
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def drop_unread_obs(cfg: dict) -> dict:
    """``cfg`` without the observation parts the agent never reads: it writes its prompt from the
    step's facts and tracks ``obs["waypoints"]``, so the frozen BEV encoder's features and the
    BEV corridor (about 97% of an env step's CPU time on the cpu preset) are switched off. The
    run's config.yaml records it, so evaluation builds the same env."""
    cfg = dict(cfg)
    obs = dict(cfg.get("obs") or {})
    obs["features"], obs["corridor"] = None, False
    cfg["obs"] = obs
    return cfg


def train_minddrive(cfg: dict, run_dir, resume: bool = False) -> dict:
    """SFT then PPO as ``cfg`` says, writing into ``run_dir``; returns the summary."""
    from ..evaluation import EpisodeAccumulator, compute_metrics
    from ..training.build import apply_torch_threads, make_env_fn, observation_signature
    from ..training.callbacks import save_checkpoint

    if resume:
        raise ValueError("algo=minddrive runs cannot be resumed yet: start a new run (its SFT "
                         "stage is short)")
    run_dir = Path(run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    cfg = drop_unread_obs(cfg)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    apply_torch_threads(cfg)
    total = int(cfg.get("total_timesteps", 0))
    if total < 1:
        raise ValueError(f"total_timesteps must be >= 1, got {total}")
    if int(cfg.get("n_envs", 1)) != 1:
        raise ValueError("algo=minddrive drives one env: set n_envs=1")
    mcfg = MindDriveConfig.from_dict(cfg["algo"])
    seed = int(cfg.get("seed", 0))
    th.manual_seed(seed)
    rng = np.random.default_rng(seed)
    env = make_env_fn(cfg)()
    env.reset(seed=seed)
    (run_dir / "obs_signature.json").write_text(json.dumps(observation_signature(env.observation_space)))
    budget = cfg.get("max_minutes")
    deadline = time.perf_counter() + 60 * float(budget) if budget else None
    ckpt_dir = run_dir / "checkpoints"
    every = int(cfg.get("checkpoint_every", 0) or 0)
    verbose = int(cfg.get("verbose", 0))
    t0 = time.perf_counter()
    reason = "failed"
    agent = None
    records = []
    n_decisions = n_updates = 0
    sft_wall = t_ppo = None
    try:
        meta = env_meta(env)
        agent = MindDriveAgent(mcfg, meta, seed)
        # ---- stage 1: SFT on the autopilot's meta-actions
        horizon = max(1, int(round(mcfg.action_horizon / meta["dt"])))
        samples = collect_expert(env, int(mcfg.sft_steps), horizon, meta["lead_range"])
        counts = {}
        for s in samples:
            counts[s[1]] = counts.get(s[1], 0) + 1
        sft_stats = {}
        if samples:
            sft_stats = sft(agent, samples, mcfg.sft_epochs, mcfg.sft_batch, mcfg.sft_lr, seed,
                            log=(lambda r: print(f"[minddrive] SFT {r}", flush=True)) if verbose else None)
        agent.stage = "sft"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        agent.save(ckpt_dir / "sft_reference.zip")
        add_reference(agent)
        # ---- stage 2: PPO in language space on the decision expert
        agent.stage = "ppo"
        t_ppo = time.perf_counter()
        sft_wall = round(t_ppo - t0, 1)
        opt = th.optim.Adam(agent.lm.adapter_params("decision") + list(agent.lm.value_head.parameters()),
                            lr=mcfg.learning_rate)
        obs, info = env.reset()
        acc = EpisodeAccumulator()
        acc.start(info)
        log_f = (run_dir / "decisions.jsonl").open("a")
        next_ckpt = every if every > 0 else None
        stopped = False
        while agent.num_timesteps < total and not stopped:
            roll = {k: [] for k in ("prompts", "masks", "actions", "logp", "values", "rewards", "dones")}
            for _ in range(mcfg.n_decisions):
                prompt = scene_prompt(info, meta["lead_range"])
                mask = agent.mask(info) if mcfg.mask_infeasible else np.ones(len(META_ACTIONS), bool)
                with th.no_grad():
                    logp, v = agent.lm.decide([prompt], allowed=mask[None])
                p = logp[0].exp().double().numpy()
                k = int(rng.choice(len(p), p=p / p.sum()))
                vt = agent.set_point(prompt, k, info)
                log_f.write(json.dumps({"step": agent.num_timesteps, "stage": "ppo", "prompt": prompt,
                                        "meta_action": META_ACTIONS[k], "probability": round(float(p[k]), 5),
                                        "set_point_ms": round(vt, 3)}) + "\n")
                r, done = 0.0, False
                for _ in range(mcfg.decision_every):
                    a = agent.control(obs, info, vt)
                    obs, _, term, trunc, info = env.step(a)
                    agent.num_timesteps += 1
                    acc.add(info)
                    r += event_reward(info)
                    if term or trunc:
                        if trunc and not term:  # a time/distance limit, not an outcome: bootstrap
                            with th.no_grad():
                                _, v_end = agent.lm.decide([scene_prompt(info, meta["lead_range"])])
                            r += mcfg.gamma * float(v_end[0])
                        records.append(acc.finish())
                        _csv_row(run_dir / "logs" / "episodes.csv",
                                 {"steps": agent.num_timesteps, "termination": info.get("termination"),
                                  "truncation": info.get("truncation"),
                                  "routes_completed": info.get("routes_completed"),
                                  "distance": round(float(info.get("distance", 0.0)), 1)})
                        done = True
                        obs, info = env.reset()
                        acc = EpisodeAccumulator()
                        acc.start(info)
                        break
                for key, val in (("prompts", prompt), ("masks", mask), ("actions", k), ("logp", float(logp[0, k])),
                                 ("values", float(v[0])), ("rewards", r), ("dones", done)):
                    roll[key].append(val)
                n_decisions += 1
                if agent.num_timesteps >= total or (deadline and time.perf_counter() > deadline):
                    stopped = True
                    break
            log_f.flush()
            with th.no_grad():
                _, last_v = agent.lm.decide([scene_prompt(info, meta["lead_range"])])
                roll["logp_ref"] = reference_logp(agent, roll["prompts"], roll["masks"])
            adv, ret = gae(roll["rewards"], roll["values"], roll["dones"], float(last_v[0]),
                           mcfg.gamma, mcfg.gae_lambda)
            roll["adv"], roll["ret"] = adv, ret
            stats = ppo_update(agent, opt, roll, mcfg, rng)
            n_updates += 1
            row = {"steps": agent.num_timesteps, "decisions": len(roll["prompts"]),
                   "reward_sum": float(np.sum(roll["rewards"])),
                   "arrivals": int(sum(x > 0 for x in roll["rewards"])),
                   "penalties": int(sum(x < 0 for x in roll["rewards"])), **stats,
                   "wall_s": round(time.perf_counter() - t0, 1)}
            _csv_row(run_dir / "logs" / "progress.csv", row)
            if verbose:
                print(f"[minddrive] PPO {row}", flush=True)
            if next_ckpt is not None and agent.num_timesteps >= next_ckpt:
                save_checkpoint(agent, ckpt_dir, with_buffer=False)
                next_ckpt += every
        log_f.close()
        reason = (f"stopped after max_minutes={budget}" if deadline and time.perf_counter() > deadline
                  and agent.num_timesteps < total else "finished")
    except BaseException as e:
        reason = f"failed: {type(e).__name__}: {e}"
        raise
    finally:
        entry = save_checkpoint(agent, ckpt_dir, with_buffer=False) if agent is not None else None
        summary = {
            "steps": int(agent.num_timesteps) if agent else 0, "total_timesteps": total, "status": reason,
            "wall_s": round(time.perf_counter() - t0, 1), "algo": "minddrive",
            "sft_wall_s": sft_wall,
            "ppo": {"env_steps": int(agent.num_timesteps) if agent else 0, "decisions": n_decisions,
                    "updates": n_updates,
                    "wall_s": round(time.perf_counter() - t_ppo, 1) if t_ppo is not None else None},
            "reward": "minddrive events (+1 arrival, -1 collision / red light / off route)",
            "checkpoint": entry, "sft_reference": str(ckpt_dir / "sft_reference.zip"),
            "sft": {"samples": len(samples) if "samples" in locals() else 0,
                    "meta_actions": dict(sorted(counts.items(), key=lambda kv: -kv[1]))
                    if "counts" in locals() else {}, **(sft_stats if "sft_stats" in locals() else {})},
            "episode_metrics": compute_metrics(records, mode="train") if records else None,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        env.close()
    return summary
