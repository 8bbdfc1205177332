"""OpenCLIP encoder slot (drivemind.vlm.openclip) and the BEV colouring it uses.

The OpenCLIP tests need the ``vision`` extra (open_clip_torch + torchvision) and skip without it
(CI's default install); ``masks_to_rgb`` is tested everywhere. The model is a tiny open_clip
config registered in code (64 wide, 2 layers, 64 px) with random weights written to a temporary
file and loaded back through the encoder's own loader; nothing is downloaded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from drivemind.bev import BEV_PRESETS, BevConfig, BevRenderer
from drivemind.bev.renderer import masks_to_rgb

TINY = "drivemind-tiny-clip"
TINY_CFG = {"embed_dim": 32,
            "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16,
                           "head_width": 32},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2,
                         "layers": 2}}
BIGG, BIGG_TAG, BIGG_REPO = "ViT-bigG-14", "laion2b_s39b_b160k", "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k"


# ---------------------------------------------------------------------- BEV colouring (no extra)
@pytest.fixture(scope="module")
def rendered():
    """A real step of the lite sim with traffic, rendered by BevRenderer (masks + colour view)."""
    from drivemind.maps import load_town, random_route
    from drivemind.sim import LiteWorld, density_config

    rm = load_town("grid")
    world = LiteWorld(rm, density_config("drivevlm"))
    route = random_route(rm, np.random.default_rng(1))
    snap = world.reset(seed=1, ego_pose=route.start)
    cfg = BEV_PRESETS["cpu"]
    r = BevRenderer(rm, cfg)
    frames = []
    for k in range(30):
        snap = world.step((0.0, 0.4))
        frames.append(r.step(snap, route.pts[:80]))
    return r, cfg, np.stack(frames)


def test_masks_to_rgb_matches_renderer_colours(rendered):
    r, cfg, frames = rendered
    snap, route = r._last
    full = r._render(r.rgb_cfg, snap, route)  # the ALL_CHANNELS stack rgb() colours
    assert np.array_equal(masks_to_rgb(full, r.rgb_cfg), r.rgb())
    rgb = masks_to_rgb(frames, cfg)
    assert rgb.shape == (len(frames), cfg.size, cfg.size, 3) and rgb.dtype == np.uint8
    assert np.array_equal(rgb[-1], masks_to_rgb(frames[-1], cfg))
    # road pixels take the road colour, empty pixels stay black
    road = frames[-1][cfg.plane_start["road"]] > 0
    others = frames[-1][[i for i in range(cfg.n_channels) if i != cfg.plane_start["road"]]].any(0)
    only_road = road & ~others
    assert only_road.any() and (rgb[-1][only_road] == (60, 64, 70)).all()
    assert (rgb[-1][~road & ~others] == 0).all()


def test_masks_to_rgb_bad_input():
    with pytest.raises(ValueError, match="15"):
        masks_to_rgb(np.zeros((3, 8, 8), np.uint8), BevConfig())
    with pytest.raises(ValueError, match="uint8"):
        masks_to_rgb(np.zeros((15, 8, 8), np.float32), BevConfig())
    cfg = BevConfig(channels=("road", "walker"), size=32, ego_from_bottom=8)
    out = masks_to_rgb(np.full(cfg.shape, 255, np.uint8), cfg)
    assert (out == out[0, 0]).all() and tuple(out[0, 0]) == (0, 230, 230)  # newest walker on top


# ---------------------------------------------------------------------- OpenCLIP (vision extra)
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny config registered with open_clip, and its random weights saved as a .pt file
    and as a hub-style folder (open_clip_config.json + open_clip_model.safetensors)."""
    open_clip = pytest.importorskip("open_clip", reason="needs the vision extra (open_clip_torch)")
    import torch
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("tiny_clip")
    (d / "configs").mkdir()
    (d / "configs" / f"{TINY}.json").write_text(json.dumps(TINY_CFG))
    wide = json.loads(json.dumps(TINY_CFG))
    wide["vision_cfg"]["width"] = 96
    (d / "configs" / f"{TINY}-wide.json").write_text(json.dumps(wide))
    open_clip.add_model_config(d / "configs")
    torch.manual_seed(0)
    model = open_clip.create_model(TINY)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save(sd, d / "tiny.pt")
    hub = d / "hub"
    hub.mkdir()
    save_file(sd, str(hub / "open_clip_model.safetensors"))
    (hub / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG}))
    return {"dir": d, "pt": d / "tiny.pt", "hub": hub, "state": sd}


@pytest.fixture(scope="module")
def enc(tiny):
    from drivemind.vlm.openclip import OpenClipEncoder

    return OpenClipEncoder(TINY, pretrained=None, weights_path=tiny["pt"], bev="cpu")


@pytest.fixture(autouse=True)
def _no_env_weights(monkeypatch):
    monkeypatch.delenv("DRIVEMIND_OPENCLIP_WEIGHTS", raising=False)


def _same_weights(encoder, state):
    sd = encoder.model.state_dict()
    return all(np.array_equal(sd[k].cpu().numpy(), v.numpy()) for k, v in state.items())


def test_loads_saved_weights(tiny, enc):
    import torch

    assert enc.weights == tiny["pt"]
    assert enc.dim == 32 and enc.image_size == 64
    assert enc.name == f"openclip:{TINY}:tiny.pt"
    assert _same_weights(enc, tiny["state"])
    torch.manual_seed(123)  # a fresh random init differs: the loader really read the file
    from drivemind.vlm.openclip import OpenClipEncoder
    rnd = OpenClipEncoder(TINY, pretrained=None)
    assert rnd.weights is None and rnd.name.endswith(":random-init")
    assert not _same_weights(rnd, tiny["state"])
    # the same file given as `pretrained` (open_clip's convention), and a folder holding it
    by_tag = OpenClipEncoder(TINY, pretrained=str(tiny["pt"]))
    assert _same_weights(by_tag, tiny["state"]) and by_tag.name == f"openclip:{TINY}:tiny.pt"
    by_dir = OpenClipEncoder(TINY, pretrained=None, weights_path=tiny["hub"])
    assert by_dir.weights.name == "open_clip_model.safetensors"
    assert _same_weights(by_dir, tiny["state"])


def test_env_var_and_hf_cache(tiny, tmp_path, monkeypatch):
    from drivemind.vlm.openclip import OpenClipEncoder

    # an hf-hub: model from a Hugging Face cache laid out as huggingface_hub writes it
    snap = tmp_path / "models--drivemind--tiny-clip" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    for f in tiny["hub"].iterdir():
        (snap / f.name).symlink_to(f)
    (tmp_path / "models--drivemind--tiny-clip" / "refs").mkdir()
    (tmp_path / "models--drivemind--tiny-clip" / "refs" / "main").write_text("0123abc")
    hub = OpenClipEncoder("hf-hub:drivemind/tiny-clip", cache_dir=tmp_path)
    assert hub.weights == snap and hub.name == "openclip:hf-hub:drivemind/tiny-clip"
    assert _same_weights(hub, tiny["state"])
    local = OpenClipEncoder("local-dir:" + str(tiny["hub"]))
    assert local.weights == tiny["hub"] and _same_weights(local, tiny["state"])
    # $DRIVEMIND_OPENCLIP_WEIGHTS (a file or a folder) comes before the Hugging Face cache
    from drivemind.vlm.openclip import resolve_openclip_weights
    monkeypatch.setenv("DRIVEMIND_OPENCLIP_WEIGHTS", str(tiny["hub"]))
    hit = resolve_openclip_weights(BIGG, BIGG_TAG, cache_dir=tmp_path)
    assert hit == tiny["hub"] / "open_clip_model.safetensors"
    monkeypatch.setenv("DRIVEMIND_OPENCLIP_WEIGHTS", str(tiny["pt"]))
    assert resolve_openclip_weights(BIGG, BIGG_TAG, cache_dir=tmp_path) == tiny["pt"]


def test_tag_resolves_from_hf_cache(tmp_path):
    pytest.importorskip("open_clip", reason="needs the vision extra (open_clip_torch)")
    from drivemind.vlm.openclip import resolve_openclip_weights

    repo = tmp_path / ("models--" + BIGG_REPO.replace("/", "--"))
    (repo / "snapshots" / "feed").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("feed")
    with pytest.raises(FileNotFoundError):
        resolve_openclip_weights(BIGG, BIGG_TAG, cache_dir=tmp_path)
    (repo / "snapshots" / "feed" / "open_clip_pytorch_model.bin").write_bytes(b"x")
    assert resolve_openclip_weights(BIGG, BIGG_TAG, cache_dir=tmp_path).name == "open_clip_pytorch_model.bin"
    (repo / "snapshots" / "feed" / "open_clip_model.safetensors").write_bytes(b"x")  # preferred
    assert resolve_openclip_weights(BIGG, BIGG_TAG, cache_dir=tmp_path).name == "open_clip_model.safetensors"


def test_missing_weights_one_clear_error(tmp_path):
    pytest.importorskip("open_clip", reason="needs the vision extra (open_clip_torch)")
    from drivemind.vlm.openclip import OpenClipEncoder

    with pytest.raises(FileNotFoundError) as ei:
        OpenClipEncoder(cache_dir=tmp_path)  # the paper's ViT-bigG-14 / laion2b_s39b_b160k
    msg = str(ei.value)
    for part in ("ViT-bigG-14", BIGG_TAG, BIGG_REPO, "open_clip_model.safetensors",
                 "open_clip_pytorch_model.bin", str(tmp_path), "$DRIVEMIND_OPENCLIP_WEIGHTS",
                 "hf download", "weights_path"):
        assert part in msg, part
    with pytest.raises(FileNotFoundError, match="weights_path .*nope.pt"):
        OpenClipEncoder(TINY, None, weights_path=tmp_path / "nope.pt")
    with pytest.raises(FileNotFoundError, match="open_clip_config.json"):
        OpenClipEncoder("hf-hub:someone/missing", cache_dir=tmp_path)


def test_bad_names(tiny):
    from drivemind.vlm.openclip import OpenClipEncoder

    with pytest.raises(ValueError, match="unknown OpenCLIP model 'ViT-Q-99'.*ViT-bigG-14"):
        OpenClipEncoder("ViT-Q-99")
    with pytest.raises(ValueError, match="unknown pretrained tag 'laion9'.*laion2b_s39b_b160k"):
        OpenClipEncoder(BIGG, "laion9")
    with pytest.raises(ValueError, match="does not hold weights"):  # a wider tiny config
        OpenClipEncoder(TINY + "-wide", None, weights_path=tiny["pt"])


def test_embed_and_encode(enc, rendered):
    _, cfg, frames = rendered
    v = enc.embed(frames[::10])
    assert v.shape == (3, 32) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # the same pixels through embed_rgb: embed = colouring + open_clip's preprocessing
    np.testing.assert_allclose(enc.embed_rgb(masks_to_rgb(frames[::10], cfg)), v, atol=1e-6)
    np.testing.assert_allclose(enc.embed(frames[0]), v[:1], atol=1e-6)  # (C, H, W) accepted
    # different BEVs give different embeddings; the same BEV the same one, in any batch
    empty = np.zeros_like(frames[:1])
    road = empty.copy()
    road[0, cfg.plane_start["road"]] = 255
    e = enc.embed(np.concatenate([empty, road, frames[:1]]), batch_size=2)
    assert np.abs(e[0] - e[1]).max() > 1e-3 and np.abs(e[1] - e[2]).max() > 1e-3
    np.testing.assert_allclose(e[2], v[0], atol=1e-5)
    # camera frames of any size
    cam = np.random.default_rng(0).integers(0, 256, (2, 90, 160, 3), dtype=np.uint8)
    c = enc.embed_rgb(cam)
    assert c.shape == (2, 32) and np.allclose(np.linalg.norm(c, axis=1), 1.0, atol=1e-5)
    assert enc.embed_rgb(np.zeros((0, 8, 8, 3), np.uint8)).shape == (0, 32)
    # text: unit rows, cached per prompt
    enc.clear_cache()
    t = enc.encode(["the car is about to crash", "no collisions occur", "the car is about to crash"])
    assert t.shape == (3, 32) and t.dtype == np.float32 and enc.cache_size == 2
    np.testing.assert_allclose(np.linalg.norm(t, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(t[0], t[2]) and np.abs(t[0] - t[1]).max() > 1e-3
    again = enc.encode(["no collisions occur"])
    assert enc.cache_size == 2 and np.array_equal(again[0], t[1])
    assert enc.encode([]).shape == (0, 32)


def test_embed_bad_input(enc):
    from drivemind.vlm.openclip import OpenClipEncoder

    with pytest.raises(ValueError, match="uint8 RGB"):
        enc.embed_rgb(np.zeros((2, 8, 8, 4), np.uint8))
    with pytest.raises(ValueError, match="15"):
        enc.embed(np.zeros((1, 7, 96, 96), np.uint8))
    with pytest.raises(TypeError, match="strings"):
        enc.encode(["ok", 3])
    with pytest.raises(ValueError, match="unknown bev preset"):
        OpenClipEncoder(TINY, None, bev="huge")
    with pytest.raises(ValueError, match="valid: model_name"):
        OpenClipEncoder.from_config({"model_name": TINY, "pretrained": None, "colour": 1})
    # the default (no bev=) reads Roach's 15 channels at any size; other layouts need bev=
    plain = OpenClipEncoder.from_config({"kind": "openclip", "model_name": TINY, "pretrained": None})
    assert plain.embed(np.zeros((1, 15, 40, 40), np.uint8)).shape == (1, 32)
    with pytest.raises(ValueError, match="pass bev="):
        plain.embed(np.zeros((1, 16, 40, 40), np.uint8))


def test_config_file_builds_the_papers_encoder_or_says_what_is_missing(tmp_path):
    pytest.importorskip("open_clip", reason="needs the vision extra (open_clip_torch)")
    from pathlib import Path

    import yaml

    from drivemind.vlm.openclip import OpenClipEncoder

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "vlm" / "openclip.yaml")
                         .read_text())
    assert cfg["name"] == "openclip"
    enc = dict(cfg["encoder"], cache_dir=str(tmp_path))
    assert (enc["model_name"], enc["pretrained"]) == (BIGG, BIGG_TAG)
    with pytest.raises(FileNotFoundError, match="open_clip_model.safetensors"):
        OpenClipEncoder.from_config(enc)


def test_drivesac_with_openclip_encoder(tiny):
    """vlm=openclip through DriveSAC: the buffer's embedding slot takes the encoder's width, stored
    embeddings are the encoder's, and the reward's prompts go through the same model's text tower."""
    import gymnasium as gym

    import drivemind  # noqa: F401
    from drivemind.agents import LABELLED, DriveSAC
    from drivemind.rewards import make_reward

    reward = make_reward("aicr_static")
    env = gym.make("DriveMind-v0", town="grid", density="regular", bev="cpu", max_episode_steps=40)
    pk = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))
    spec = {"kind": "openclip", "model_name": TINY, "pretrained": None, "weights_path": str(tiny["pt"]),
            "bev": "cpu"}
    m = DriveSAC(env=env, reward_fn=reward, encoder=spec, buffer_size=200, batch_size=8,
                 learning_starts=20, seed=0, device="cpu", policy_kwargs=pk)
    assert m.replay_buffer.embedding_dim == 32 == m.bev_clip().dim
    assert reward.text_encoder is m.bev_clip()
    m.learn(40)
    buf = m.replay_buffer
    s = int(buf.slots(LABELLED)[3])
    want = m.bev_clip().embed(buf.observation(s, next=True)["bev"][None])[0]
    assert np.allclose(buf.embeddings.reshape(-1, 32)[s].astype(np.float32), want, atol=3e-3)
    # the embedding worker hosts BEV-CLIP only: with OpenCLIP the service leaves embeddings inline
    m2 = DriveSAC(env=env, reward_fn=reward, encoder=spec, reward_service=True, buffer_size=50,
                  device="cpu", policy_kwargs=pk)
    assert m2.reward_service is not None and not m2.labeller.embeds_in_service()


def test_model_config_json_file(tiny, tmp_path):
    """model_name may be an open_clip model-config .json (bare, or a hub folder's
    open_clip_config.json): the architecture is registered under a name that never shadows a
    built-in one, the checkpoint is loaded through weights_path, and a bad file gets one error."""
    import open_clip

    from drivemind.vlm.openclip import OpenClipEncoder, register_config_file

    bare = tmp_path / "ViT-B-32.json"  # the same stem as a built-in model must not replace it
    bare.write_text(json.dumps(TINY_CFG))
    e = OpenClipEncoder(str(bare), pretrained=None, weights_path=tiny["pt"], bev="cpu")
    assert e.dim == 32 and e.image_size == 64 and e.name == "openclip:ViT-B-32.json:tiny.pt"
    assert _same_weights(e, tiny["state"])
    assert open_clip.get_model_config("ViT-B-32")["embed_dim"] == 512  # the built-in is intact
    hub_form = OpenClipEncoder(str(tiny["hub"] / "open_clip_config.json"), pretrained=str(tiny["pt"]))
    assert _same_weights(hub_form, tiny["state"])
    assert register_config_file(bare) == register_config_file(bare)  # registered once
    rnd = OpenClipEncoder.from_config({"model_name": str(bare), "pretrained": "none"})
    assert rnd.weights is None and rnd.name == "openclip:ViT-B-32.json:random-init"
    with pytest.raises(ValueError, match="unknown pretrained tag 'laion2b_s39b_b160k'"):
        OpenClipEncoder(str(bare), pretrained="laion2b_s39b_b160k")
    with pytest.raises(FileNotFoundError, match="nope.json not found"):
        OpenClipEncoder(str(tmp_path / "nope.json"), pretrained=None)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        OpenClipEncoder(str(tmp_path / "broken.json"), pretrained=None)
    (tmp_path / "partial.json").write_text(json.dumps({"embed_dim": 32, "vision_cfg": {}}))
    with pytest.raises(ValueError, match="lacks text_cfg"):
        OpenClipEncoder(str(tmp_path / "partial.json"), pretrained=None)
    wide = json.loads(json.dumps(TINY_CFG))
    wide["embed_dim"] = 48
    bare.write_text(json.dumps(wide))  # an edited file is registered afresh
    assert OpenClipEncoder(str(bare), pretrained=None).dim == 48


def test_shipped_tiny_config_through_reward_quality(tmp_path):
    """bench.py reward-quality --vlm openclip with the shipped configs/vlm/openclip_tiny.json: the
    random tower is seeded by --seed, so its checkpoint saved from the same seed and passed as
    --weights-path gives the same figures, and one saved from another seed does not (the file
    is really read)."""
    open_clip = pytest.importorskip("open_clip", reason="needs the vision extra (open_clip_torch)")
    from pathlib import Path

    import torch

    from drivemind.vlm.openclip import register_config_file
    from script_loader import load_script

    bench = load_script("bench")
    cfg = Path(__file__).resolve().parents[1] / "configs" / "vlm" / "openclip_tiny.json"
    base = ["reward-quality", "--vlm", "openclip", "--model", str(cfg), "--towns", "grid",
            "--densities", "dense", "--drivers", "expert,random", "--steps", "40", "--seed", "10000",
            "--rewards", "aicr_static,vlm_rl", "--plot", "", "--learn-rounds", "2"]
    def keys(out):
        return (out["retrieval_top1"], out["found_rl_p_at"], out["per_reward"]["aicr_static"]["safe_mean"])

    rnd = bench.main(base + ["--pretrained", "none"])
    assert rnd["encoder"] == "openclip:openclip_tiny.json:random-init"
    assert rnd["rows"] > 10 and 0.0 <= rnd["retrieval_top1"] <= 1.0
    for seed in (10000, 7):
        torch.manual_seed(seed)
        model = open_clip.create_model(register_config_file(cfg))
        torch.save(model.state_dict(), tmp_path / f"tiny_{seed}.pt")
    same = bench.main(base + ["--weights-path", str(tmp_path / "tiny_10000.pt")])
    assert same["encoder"] == "openclip:openclip_tiny.json:tiny_10000.pt"
    assert keys(same) == keys(rnd)
    other = bench.main(base + ["--weights-path", str(tmp_path / "tiny_7.pt")])
    assert keys(other)[1:] != keys(rnd)[1:]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="lacks embed_dim"):
        bench.main(base + ["--model", str(tmp_path / "bad.json")])
