"""The papers' published test results, to print beside ours (``scripts/report.py``).

Only numbers that are in the seed papers (``shared/seeds``: DriveMind ``000``, VLM-RL ``003``; the
digest ``PAPERS.md`` quotes some of them), as mean and standard deviation over three seeds, CARLA,
10 fixed test routes. Each entry: ``source`` (paper and table), ``label`` (the paper's name),
``reward``/``ablate``/``algo`` (our config names for the same method, ``None`` where we have no
counterpart), ``town``/``density`` and ``metrics`` ``{key: (mean, std)}`` (AS km/h, RC, TD m,
CS km/h, SR). Where a table does not name the algorithm (Revolve, the VLM-based rewards, VLM-RL,
DriveMind) it is SAC: both papers train those with SAC (DriveMind: "All baselines share
DriveMind's network architectures and hyperparameters"; VLM-RL's PPO variant is a separate figure).
"""

from __future__ import annotations

DM_T1 = "DriveMind (Wasif et al.) Table 1"
DM_T2 = "DriveMind (Wasif et al.) Table 2"
VR_T4 = "VLM-RL (Huang et al.) Table 4"
VR_T5 = "VLM-RL (Huang et al.) Table 5"

_K5 = ("AS", "RC", "TD", "CS", "SR")
_K4 = ("AS", "RC", "CS", "SR")


def _e(source, label, reward, algo, town, density, keys, values, ablate=None):
    return {"source": source, "label": label, "reward": reward, "ablate": ablate, "algo": algo,
            "town": town, "density": density,
            "metrics": {k: (float(m), float(s)) for k, (m, s) in zip(keys, values)}}


# DriveMind Table 1 (Town 2, testing; the same numbers as VLM-RL Table 2 for the shared rows, except
# LORD-Speed's RC std: 0.05 here, 0.08 in VLM-RL)
_T1 = [
    ("TIRL-SAC", "tirl", "sac", [(0.37, 0.28), (0.01, 0.001), (4.7, 3.5), (0.24, 0.34), (0.00, 0.00)]),
    ("TIRL-PPO", "tirl", "ppo", [(0.43, 0.23), (0.01, 0.005), (14.8, 9.7), (0.10, 0.15), (0.00, 0.00)]),
    ("Chen-SAC", "chen", "sac", [(21.4, 1.16), (0.29, 0.12), (663.6, 286.7), (2.07, 2.21), (0.08, 0.08)]),
    ("ASAP-RL-PPO", "asap", "ppo", [(1.25, 0.30), (0.01, 0.00), (28.1, 3.4), (0.61, 0.61), (0.00, 0.00)]),
    ("ChatScene-SAC", "chatscene", "sac", [(17.7, 0.12), (0.88, 0.03), (1763.2, 90.9), (1.18, 0.46), (0.73, 0.05)]),
    ("ChatScene-PPO", "chatscene", "ppo", [(15.3, 0.33), (0.78, 0.05), (1515.6, 129.1), (0.89, 0.32), (0.63, 0.05)]),
    ("Revolve", "revolve", "sac", [(18.4, 0.03), (0.92, 0.11), (1915.3, 248.3), (1.53, 2.16), (0.83, 0.24)]),
    ("Revolve-Auto", None, "sac", [(17.2, 0.76), (0.80, 0.06), (1539.6, 147.5), (1.65, 0.28), (0.63, 0.05)]),
    ("VLM-SR", "vlm_sr", "sac", [(0.53, 0.27), (0.02, 0.00), (47.9, 9.2), (0.18, 0.25), (0.00, 0.00)]),
    ("RoboCLIP", "roboclip", "sac", [(0.44, 0.05), (0.07, 0.03), (146.3, 62.3), (1.05, 0.58), (0.00, 0.00)]),
    ("VLM-RM", "vlm_rm", "sac", [(0.20, 0.05), (0.02, 0.01), (35.9, 25.8), (0.003, 0.005), (0.00, 0.00)]),
    ("LORD", "lord", "sac", [(0.17, 0.08), (0.02, 0.02), (45.1, 57.1), (0.02, 0.02), (0.00, 0.00)]),
    ("LORD-Speed", "lord_speed", "sac", [(18.9, 0.36), (0.87, 0.05), (1783.4, 172.8), (2.80, 1.16), (0.67, 0.05)]),
    ("VLM-RL", "vlm_rl", "sac", [(19.3, 1.29), (0.97, 0.03), (2028.2, 96.60), (0.02, 0.03), (0.93, 0.04)]),
    ("DriveMind", "drivemind", "sac", [(19.4, 2.34), (0.98, 0.03), (2083.1, 50.09), (0.01, 0.07), (0.97, 0.06)]),
]

# DriveMind Table 2 (ablations, Town 2; AS, RC, CS, SR only)
_T2 = [
    ("DriveMind, NoAICR", "aicr", [(17.6, 0.95), (0.82, 0.07), (1.66, 0.45), (0.67, 0.13)]),
    ("DriveMind, NoHVFR", "hvfr", [(0.58, 0.25), (0.02, 0.00), (0.14, 0.21), (0.00, 0.00)]),
    ("DriveMind, NoPCFM", "pcfm", [(19.2, 1.14), (0.92, 0.05), (0.02, 0.02), (0.87, 0.06)]),
    ("DriveMind, Full", None, [(19.4, 2.34), (0.98, 0.03), (0.01, 0.07), (0.97, 0.06)]),
]

# VLM-RL Table 4 (held-out towns, regular traffic; Town 4 left out: we do not ship Town04)
_T4 = {
    "Town01": [("ChatScene-SAC", "chatscene", [(18.2, 0.25), (0.83, 0.09), (4408.8, 671.0), (4.50, 2.84), (0.67, 0.17)]),
               ("Revolve", "revolve", [(18.9, 0.28), (0.84, 0.07), (4458.7, 449.5), (4.27, 2.00), (0.72, 0.17)]),
               ("VLM-RL", "vlm_rl", [(22.9, 0.63), (1.00, 0.00), (5697.6, 0.79), (0.03, 0.05), (1.00, 0.00)])],
    "Town03": [("ChatScene-SAC", "chatscene", [(17.8, 0.22), (0.85, 0.04), (3436.5, 355.4), (1.60, 0.44), (0.77, 0.12)]),
               ("Revolve", "revolve", [(18.5, 0.41), (0.75, 0.16), (2979.3, 649.5), (5.22, 0.77), (0.53, 0.21)]),
               ("VLM-RL", "vlm_rl", [(21.7, 0.55), (0.91, 0.07), (3757.8, 248.0), (1.14, 1.54), (0.87, 0.09)])],
    "Town05": [("ChatScene-SAC", "chatscene", [(18.4, 0.06), (0.85, 0.04), (2826.3, 350.6), (2.14, 1.34), (0.73, 0.09)]),
               ("Revolve", "revolve", [(19.0, 0.63), (0.78, 0.06), (2671.6, 231.4), (5.35, 1.95), (0.53, 0.09)]),
               ("VLM-RL", "vlm_rl", [(22.9, 0.86), (0.93, 0.03), (3322.5, 203.4), (0.46, 0.54), (0.87, 0.05)])],
}

# VLM-RL Table 5 (Town 2 at other densities; the regular rows are Table 2's)
_T5 = {
    "empty": [("ChatScene-SAC", "chatscene", [(18.0, 0.18), (1.0, 0.0), (2064.1, 4.81), (0.0, 0.0), (1.0, 0.0)]),
              ("Revolve", "revolve", [(18.6, 0.39), (1.0, 0.0), (2105.5, 21.0), (0.0, 0.0), (1.0, 0.0)]),
              ("VLM-RL", "vlm_rl", [(23.8, 0.29), (1.0, 0.0), (2113.9, 0.67), (0.0, 0.0), (1.0, 0.0)])],
    "dense": [("ChatScene-SAC", "chatscene", [(17.3, 0.15), (0.85, 0.06), (1734.2, 92.3), (2.71, 0.65), (0.77, 0.12)]),
              ("Revolve", "revolve", [(18.3, 0.31), (0.89, 0.06), (1861.0, 144.3), (3.53, 0.52), (0.73, 0.05)]),
              ("VLM-RL", "vlm_rl", [(16.1, 1.00), (0.87, 0.06), (1819.0, 166.6), (0.11, 0.10), (0.80, 0.08)])],
}

PUBLISHED: list[dict] = (
    [_e(DM_T1, lab, r, a, "Town02", "regular", _K5, v) for lab, r, a, v in _T1]
    + [_e(DM_T2, lab, "drivemind", "sac", "Town02", "regular", _K4, v, ablate=ab) for lab, ab, v in _T2]
    + [_e(VR_T4, lab, r, "sac", t, "regular", _K5, v) for t, rows in _T4.items() for lab, r, v in rows]
    + [_e(VR_T5, lab, r, "sac", "Town02", d, _K5, v) for d, rows in _T5.items() for lab, r, v in rows]
)


def published_for(reward: str, ablate, algo: str, town: str, density: str) -> list[dict]:
    """The published entries for our method ``reward`` (``ablate``: None/"none" for the full
    reward) with ``algo`` on ``town`` x ``density``."""
    ab = None if ablate in (None, "", "none") else str(ablate)
    return [e for e in PUBLISHED if e["reward"] == reward and e["ablate"] == ab
            and e["algo"] == algo and e["town"] == town and e["density"] == density]
