import contextlib
import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vlgrpo.cli import main
from vlgrpo.data.adapters import load_samples
from vlgrpo.data.images import image_sha256, load_image
from vlgrpo.models import load_model
from vlgrpo.vision_cache import (
    CacheDirError,
    VisionCache,
    disk_stats,
    processor_fingerprint,
    read_entry,
    vision_fingerprint,
)


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return load_model(tiny_model_dir("qwen2_5_vl"))


@pytest.fixture(scope="module")
def images(shapes_dir):
    return [s.image for s in load_samples(shapes_dir / "train.jsonl").samples[:4]]


def _pixel_features(lm, paths):
    """Reference: the model's own pixel path (processor -> get_image_features)."""
    out = lm.processor.image_processor(images=[load_image(p) for p in paths], return_tensors="pt")
    with torch.no_grad():
        feats = lm.model.model.get_image_features(out["pixel_values"], out["image_grid_thw"], return_dict=True)
    return list(feats.pooler_output), out["image_grid_thw"]


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_features_equal_the_pixel_path_and_duplicates_are_encoded_once(tiny_model_dir, images, arch):
    lm = load_model(tiny_model_dir(arch))
    cache = VisionCache(lm.model, lm.processor)
    a, b, c = images[:3]
    feats = cache.get([a, b, a])
    ref, grid = _pixel_features(lm, [a, b])
    assert torch.equal(feats[0].embeds, ref[0]) and torch.equal(feats[1].embeds, ref[1])
    assert feats[0].grid_thw.tolist() == grid[0].tolist() == [1, 8, 8]  # 112 px -> 8x8 patches (Qwen3-VL: 128 px)
    assert feats[0].embeds.shape == (16, 128)  # 8*8 / 2*2 merged tokens, LM hidden 128
    maps = 2 if arch == "qwen3_vl" else 0  # Qwen3-VL: a DeepStack map per deepstack_visual_indexes entry
    assert (feats[0].deepstack is None) is (maps == 0)
    if maps:
        assert feats[0].deepstack.shape == (maps, 16, 128)
    assert feats[2] is feats[0]
    entry = (1 + maps) * 16 * 128 * 4 + 3 * 8
    assert cache.stats() == {
        "hits": 0,
        "misses": 2,
        "encoder_calls": 1,
        "images_encoded": 2,
        "videos_encoded": 0,
        "disk_hits": 0,
        "corrupt": 0,
        "other_format": 0,
        "write_errors": 0,
        "adopted": 0,
        "bytes": 2 * entry,
    }
    # bytes of the same image under another path are the same cache entry
    cache.get([b, c, open(a, "rb").read()])
    s = cache.stats()
    assert (s["hits"], s["misses"], s["encoder_calls"], s["images_encoded"]) == (2, 3, 2, 3)
    cache.reset_stats()
    assert cache.stats()["encoder_calls"] == 0 and cache.stats()["bytes"] == 3 * entry


def test_a_frozen_towers_features_are_handed_over_to_a_cache_of_the_same_weights(lm, tiny_model_dir, images, tmp_path):
    """A split rollout's worker hands its trainer what it encoded: the trainer's cache serves the same tensors
    without an encoder call, and writes them to its disk store as if it had encoded them."""
    worker = VisionCache(lm.model, lm.processor)
    encoded = worker.get(images[:3])
    handed = worker.handover([images[0], images[2], images[0], images[3]])  # images[3] never encoded: not handed
    assert len(handed[1]) == 2
    trainer = VisionCache(load_model(tiny_model_dir("qwen2_5_vl")).model, lm.processor, disk_dir=tmp_path / "vc")
    assert trainer.adopt(handed) == 2 and trainer.adopt(handed) == 0  # already held
    got = trainer.get([images[2], images[0]])
    assert torch.equal(got[0].embeds, encoded[2].embeds) and torch.equal(got[1].embeds, encoded[0].embeds)
    s = trainer.stats()
    assert (s["adopted"], s["hits"], s["misses"], s["encoder_calls"]) == (2, 2, 0, 0)
    assert len(list((tmp_path / "vc").rglob("*.safetensors"))) == 2
    # other weights: their keys could never be hit here, so nothing is taken; a trainable tower hands nothing over
    other = load_model(tiny_model_dir("qwen2_5_vl")).model
    with torch.no_grad():
        next(other.model.visual.parameters()).add_(1.0)
    assert VisionCache(other, lm.processor).adopt(handed) == 0
    assert VisionCache(lm.model, lm.processor, trainable=True).handover(images[:1]) is None


def test_lru_evicts_least_recently_used_within_the_byte_budget(lm, images):
    entry = 16 * 128 * 4 + 3 * 8
    cache = VisionCache(lm.model, lm.processor, max_bytes=2 * entry)
    a, b, c = images[:3]
    cache.get([a])
    cache.get([b])
    cache.get([a])  # a is now the most recently used
    cache.get([c])  # evicts b
    assert cache.stats()["bytes"] == 2 * entry
    cache.reset_stats()
    cache.get([a, c])
    assert cache.stats()["misses"] == 0
    cache.get([b])
    assert cache.stats()["misses"] == 1


def test_disk_cache_survives_a_restart_and_recovers_from_corrupt_files(lm, tiny_model_dir, images, tmp_path):
    disk = tmp_path / "vcache"
    first = VisionCache(lm.model, lm.processor, disk_dir=disk).get(images[:3])
    files = sorted(disk.glob("*/*.safetensors"))
    assert len(files) == 3 and not list(disk.glob("*/.tmp-*"))
    meta_file = load_file(str(files[0]))
    assert set(meta_file) == {"embeds", "grid_thw"}

    # restart: a fresh process would reload the checkpoint; the fingerprint must be the same
    again = load_model(tiny_model_dir("qwen2_5_vl"))
    cache = VisionCache(again.model, again.processor, disk_dir=disk)
    feats = cache.get(images[:3])
    assert cache.stats()["disk_hits"] == 3 and cache.stats()["encoder_calls"] == 0
    assert all(torch.equal(x.embeds, y.embeds) for x, y in zip(feats, first))

    # one truncated file, one flipped byte: both counted, deleted, recomputed in one encoder call
    data = files[0].read_bytes()
    files[0].write_bytes(data[: len(data) // 2])
    blob = bytearray(files[1].read_bytes())
    blob[-5] ^= 0xFF
    files[1].write_bytes(bytes(blob))
    assert read_entry(files[0]) is None and read_entry(files[1]) is None
    cache = VisionCache(lm.model, lm.processor, disk_dir=disk)
    feats = cache.get(images[:3])
    s = cache.stats()
    assert (s["corrupt"], s["disk_hits"], s["encoder_calls"], s["images_encoded"]) == (2, 1, 1, 2)
    assert all(torch.equal(x.embeds, y.embeds) for x, y in zip(feats, first))
    assert read_entry(files[0]) is not None and read_entry(files[1]) is not None  # rewritten whole

    # an entry in another format version (another vlgrpo's layout, checksum intact): a miss, counted, rewritten
    from safetensors.torch import save_file

    from vlgrpo.vision_cache import FORMAT_VERSION, entry_format

    with safe_open(str(files[2]), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(files[2]), metadata={**meta, "format": "2"})
    assert read_entry(files[2]) is not None  # the file itself is sound: only its version tells it apart
    cache = VisionCache(lm.model, lm.processor, disk_dir=disk)
    cache.get(images[:3])
    s = cache.stats()
    assert (s["other_format"], s["corrupt"], s["disk_hits"], s["images_encoded"]) == (1, 0, 2, 1)
    assert entry_format(files[2]) == FORMAT_VERSION


def test_fingerprints_follow_the_vision_weights_and_processor_only(tiny_model_dir):
    lm = load_model(tiny_model_dir("qwen2_5_vl"))
    fp = vision_fingerprint(lm.model)
    assert fp == vision_fingerprint(load_model(tiny_model_dir("qwen2_5_vl")).model)
    with torch.no_grad():
        lm.model.model.language_model.layers[0].mlp.up_proj.weight.add_(1.0)
    assert vision_fingerprint(lm.model) == fp  # language weights are not part of it
    with torch.no_grad():
        lm.model.model.visual.merger.mlp[0].weight[0, 0] += 1e-3  # the merger is inside `visual`
    assert vision_fingerprint(lm.model) != fp
    q2 = load_model(tiny_model_dir("qwen2_vl"))
    assert len(vision_fingerprint(q2.model)) == 16
    small = load_model(tiny_model_dir("qwen2_5_vl"), max_pixels=28 * 28 * 16)
    assert processor_fingerprint(small.processor) != processor_fingerprint(lm.processor)

    # ZeRO-3 partitioned parameters: hashing the empty shards would collide, so gather first or refuse
    gathered = []
    fp_now = vision_fingerprint(lm.model)
    gather = lambda ps: gathered.append(len(ps)) or contextlib.nullcontext()  # noqa: E731
    assert vision_fingerprint(lm.model, gather=gather) == fp_now
    assert gathered == [len(list(lm.model.model.visual.parameters()))]
    lm.model.model.visual.merger.mlp[0].weight.ds_id = 7
    with pytest.raises(ValueError, match="partitioned .DeepSpeed ZeRO-3.: pass gather="):
        vision_fingerprint(lm.model)


def test_trainable_tower_versions_by_step_and_encodes_with_grad(lm, images, tmp_path):
    cache = VisionCache(lm.model, lm.processor, trainable=True, disk_dir=tmp_path / "d")
    a, b = images[:2]
    cache.get([a, b])
    cache.set_step(0)
    cache.get([a])
    assert cache.stats()["hits"] == 1
    cache.set_step(1)  # new weights: entries of step 0 can never be served again
    assert cache.stats()["bytes"] == 0
    cache.get([a])
    s = cache.stats()
    assert (s["misses"], s["encoder_calls"]) == (3, 2)
    assert not (tmp_path / "d").exists()  # per-step entries are never written to disk

    grad_feats = cache.encode_with_grad([a, b, a])
    assert grad_feats[0] is grad_feats[2] and grad_feats[0].embeds.requires_grad
    assert torch.allclose(grad_feats[0].embeds, cache.get([a])[0].embeds, atol=0, rtol=0)
    grad_feats[1].embeds.sum().backward()
    assert lm.model.model.visual.merger.mlp[0].weight.grad.abs().sum() > 0
    lm.model.zero_grad(set_to_none=True)

    frozen = VisionCache(lm.model, lm.processor)
    frozen.get([a])
    frozen.set_step(5)  # frozen tower: a no-op
    frozen.get([a])
    assert frozen.stats()["hits"] == 1


def test_cli_cache_stats_and_clear(lm, images, tmp_path, capsys):
    disk = tmp_path / "vc"
    cache = VisionCache(lm.model, lm.processor, disk_dir=disk)
    cache.get(images[:2])
    (disk / "README").write_text("not a cache entry")
    assert main(["cache", "stats", str(disk)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["entries"] == 2 and stats["by_vision_version"] == {cache.version: 2} and stats["bytes"] > 2 * 8192
    assert main(["cache", "clear", str(disk)]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 2
    assert disk_stats(disk)["entries"] == 0 and (disk / "README").exists()
    shutil.rmtree(disk)
    assert main(["cache", "stats", str(disk)]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(CacheDirError, match="vision_cache_dir"):
        disk_stats(disk)


def test_an_entry_copied_over_another_key_is_not_served(lm, images, tmp_path):
    disk = tmp_path / "vc"
    a, b = images[:2]
    first = VisionCache(lm.model, lm.processor, disk_dir=disk)
    fa, fb = first.get([a, b])
    assert not torch.equal(fa.embeds, fb.embeds)
    path_a, path_b = (first._path(first.key(image_sha256(x))) for x in (a, b))
    shutil.copyfile(path_a, path_b)  # a valid entry (checksum and shapes fine) under B's name
    cache = VisionCache(lm.model, lm.processor, disk_dir=disk)
    (got,) = cache.get([b])
    assert torch.equal(got.embeds, fb.embeds)  # B's own features, recomputed: A's entry was refused
    s = cache.stats()
    assert (s["corrupt"], s["disk_hits"], s["images_encoded"]) == (1, 0, 1)
    assert read_entry(path_b, key=cache.key(image_sha256(b))) is not None  # rewritten under its own key


def test_a_cache_write_that_fails_is_skipped_and_counted(lm, images, tmp_path, monkeypatch, capsys):
    import errno

    import safetensors.torch

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    disk = tmp_path / "vc"
    cache = VisionCache(lm.model, lm.processor, disk_dir=disk)
    feats = cache.get(images[:3])
    assert len(feats) == 3 and cache.stats()["write_errors"] == 3  # served from memory all the same
    assert not list(disk.rglob("*.safetensors")) and not list(disk.rglob(".tmp-*"))
    err = capsys.readouterr().err
    assert err.count("not written") == 1 and "No space left on device" in err and str(disk) in err
    assert cache.get(images[:1])[0] is feats[0] and cache.stats()["hits"] == 1


# ---------------------------------------------------------------- Qwen3-VL: DeepStack maps in every entry


def _prefill(lm, sample, feats):
    """The HF engine's prefill of one prompt from `feats` -> (last-position logits [1, V], KV cache)."""
    from vlgrpo.policy.prefill import prefill
    from vlgrpo.policy.prompt import build_prompt

    p = build_prompt(sample, lm.processor)
    ids = torch.tensor([p.input_ids])
    with torch.no_grad():
        last, kv, _ = prefill(lm.model, ids, torch.ones_like(ids), torch.tensor([p.mm_token_type_ids]), feats)
    return last, kv


def _pixel_last_logits(lm, sample):
    """The model's own forward on pixels (its own DeepStack path): logits of the last prompt position."""
    from vlgrpo.data.prompts import render_messages

    text = lm.processor.apply_chat_template(render_messages(sample), add_generation_prompt=True, tokenize=False)
    inputs = lm.processor(text=[text], images=[load_image(sample.image)], return_tensors="pt")
    with torch.no_grad():
        return lm.model(**inputs).logits[:, -1]


def test_a_qwen3_vl_entry_holds_every_deepstack_map_and_a_hit_prefills_bit_for_bit(
    tiny_model_dir, shapes_dir, tmp_path
):
    """Fresh encode, memory hit and disk hit (a restarted process) give the same prefill bit for bit, equal to the
    model's own pixel forward; the same features short of their DeepStack maps give other logits, so a cache that
    dropped them fails here."""
    from vlgrpo.vision_cache import ImageFeatures

    samples = load_samples(shapes_dir / "train.jsonl").samples[:2]
    lm = load_model(tiny_model_dir("qwen3_vl"))
    disk = tmp_path / "vc"
    cache = VisionCache(lm.model, lm.processor, disk_dir=disk)
    fresh = cache.get([s.image for s in samples])
    out = lm.processor.image_processor(images=[load_image(s.image) for s in samples], return_tensors="pt")
    with torch.no_grad():
        ref = lm.model.model.get_image_features(out["pixel_values"], out["image_grid_thw"], return_dict=True)
    assert len(ref.deepstack_features) == 2  # deepstack_visual_indexes (0, 1)
    for j, f in enumerate(fresh):
        assert f.deepstack.shape == (2, 16, 128)
        assert all(torch.equal(f.deepstack[i], ref.deepstack_features[i][j]) for i in range(2))
    files = sorted(disk.glob("*/*.safetensors"))
    assert len(files) == 2 and all(set(load_file(str(p))) == {"embeds", "grid_thw", "deepstack"} for p in files)

    memory = cache.get([s.image for s in samples])
    again = load_model(tiny_model_dir("qwen3_vl"))  # a restart: the same key, served from disk
    restarted = VisionCache(again.model, again.processor, disk_dir=disk)
    from_disk = restarted.get([s.image for s in samples])
    assert (cache.stats()["hits"], restarted.stats()["disk_hits"], restarted.stats()["encoder_calls"]) == (2, 2, 0)
    for j, s in enumerate(samples):
        last, kv = _prefill(lm, s, [fresh[j]])
        for feats in (memory[j], from_disk[j]):
            hit_last, hit_kv = _prefill(lm, s, [feats])
            assert torch.equal(hit_last, last)
            assert all(
                torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
                for a, b in zip(hit_kv.layers, kv.layers)
            )
        own = _pixel_last_logits(lm, s)
        assert (last - own).abs().max() <= 1e-5
        dropped = ImageFeatures(fresh[j].embeds, fresh[j].grid_thw, torch.zeros_like(fresh[j].deepstack))
        assert (_prefill(lm, s, [dropped])[0] - own).abs().max() > 1e-3  # the maps matter at this size
    with pytest.raises(ValueError, match="lack the model's 2 DeepStack maps"):
        _prefill(lm, samples[0], [ImageFeatures(fresh[0].embeds, fresh[0].grid_thw)])


def test_a_qwen3_5_entry_has_no_deepstack_maps_and_a_hit_prefills_every_layer_state_bit_for_bit(
    tiny_model_dir, shapes_dir, tmp_path
):
    """Qwen3.5 (Qwen3-VL's tower without DeepStack): entries hold the embeddings and grid alone; a fresh encode, a
    memory hit and a disk hit give the same prefill bit for bit, keys and values of the attention layers and the
    conv and recurrent states of the Gated DeltaNet ones, equal to the model's own pixel forward."""
    samples = load_samples(shapes_dir / "train.jsonl").samples[:2]
    lm = load_model(tiny_model_dir("qwen3_5"))
    disk = tmp_path / "vc"
    cache = VisionCache(lm.model, lm.processor, disk_dir=disk)
    fresh = cache.get([s.image for s in samples])
    assert all(f.deepstack is None for f in fresh)
    files = sorted(disk.glob("*/*.safetensors"))
    assert len(files) == 2 and all(set(load_file(str(p))) == {"embeds", "grid_thw"} for p in files)
    memory = cache.get([s.image for s in samples])
    again = load_model(tiny_model_dir("qwen3_5"))  # a restart: the same key, served from disk
    from_disk = VisionCache(again.model, again.processor, disk_dir=disk).get([s.image for s in samples])

    def states(kv):
        return [
            (layer.conv_states[0], layer.recurrent_states[0])
            if hasattr(layer, "conv_states")
            else (layer.keys, layer.values)
            for layer in kv.layers
        ]

    for j, s in enumerate(samples):
        last, kv = _prefill(lm, s, [fresh[j]])
        assert [len(x) for x in states(kv)] == [2] * 4 and hasattr(kv.layers[0], "conv_states")
        for feats in (memory[j], from_disk[j]):
            hit_last, hit_kv = _prefill(lm, s, [feats])
            assert torch.equal(hit_last, last)
            assert all(torch.equal(a, b) for x, y in zip(states(hit_kv), states(kv)) for a, b in zip(x, y))
        assert (last - _pixel_last_logits(lm, s)).abs().max() <= 1e-5


def test_a_disk_entry_short_of_its_deepstack_maps_is_refused_and_re_encoded(tiny_model_dir, images, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    lm = load_model(tiny_model_dir("qwen3_vl"))
    disk = tmp_path / "vc"
    (first,) = VisionCache(lm.model, lm.processor, disk_dir=disk).get(images[:1])
    (path,) = disk.glob("*/*.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    del tensors["deepstack"]
    save_file(tensors, str(path), metadata=meta)  # key and checksum metadata kept: only the maps are gone
    assert read_entry(path) is None
    cache = VisionCache(lm.model, lm.processor, disk_dir=disk)
    (got,) = cache.get(images[:1])
    s = cache.stats()
    assert (s["corrupt"], s["disk_hits"], s["encoder_calls"]) == (1, 0, 1)
    assert torch.equal(got.deepstack, first.deepstack) and read_entry(path).deepstack is not None  # rewritten whole


def test_the_key_separates_archs_and_vision_configs(tiny_model_dir, tmp_path):
    """Same weights, other DeepStack layers: other features, so another key. Qwen3-VL's 16 px patches change the
    processor fingerprint too."""
    from vlgrpo.tiny import TinySpec, init_tiny

    q3 = load_model(tiny_model_dir("qwen3_vl"))
    q25 = load_model(tiny_model_dir("qwen2_5_vl"))
    assert vision_fingerprint(q3.model) != vision_fingerprint(q25.model)
    assert processor_fingerprint(q3.processor) != processor_fingerprint(q25.processor)
    swapped = load_model(str(init_tiny(tmp_path / "m", "qwen3_vl", TinySpec(deepstack_visual_indexes=(1, 0)))))
    a, b = q3.model.model.visual.state_dict(), swapped.model.model.visual.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the same weights, seed 0
    assert vision_fingerprint(swapped.model) != vision_fingerprint(q3.model)
    sha = "0" * 64
    assert VisionCache(swapped.model, swapped.processor).key(sha) != VisionCache(q3.model, q3.processor).key(sha)
