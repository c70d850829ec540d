"""Rollout and log-prob pass: naive (pixels every pass, prompt prefilled G times) vs vlgrpo (cached vision features,
prompt prefilled once, own decode loop), on a ~2.4 M-parameter tiny Qwen2.5-VL, one CPU thread.

Naive is what TRL-style trainers do: `generate(pixel_values, num_return_sequences=G)` and a log-prob forward over G
rows that each carry the image's pixels. Every completion is exactly `--new-tokens` long in both paths (EOS is
suppressed) so the work compared is identical. Usage: python benchmarks/bench_rollout.py [--sizes 112,448,672 --g 8]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from vlgrpo.data.images import load_image
from vlgrpo.data.prompts import render_messages
from vlgrpo.data.synth import draw_scene
from vlgrpo.models import load_model, placeholder_token_ids
from vlgrpo.policy.forward import collate_groups, completion_logprobs
from vlgrpo.policy.prompt import forbidden_mask
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.tiny import TinySpec, init_tiny
from vlgrpo.types import Sample
from vlgrpo.vision_cache import VisionCache

# ~2.4 M parameters: 6 language layers of width 128, a 4-block vision tower of width 128.
SPEC = TinySpec(num_layers=6, vision_hidden=128, vision_depth=4, vision_intermediate=256, max_pixels=28 * 28 * 576)


def timed(fn, repeats: int) -> tuple[float, object]:
    """Fastest wall time in ms of `repeats` runs after one warm-up run (the minimum filters out other processes on
    a shared machine), and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - start) * 1000)
    return min(times), out


def naive_generate(model, processor, text: str, image, g: int, new_tokens: int):
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    with torch.no_grad():
        return model.generate(
            **inputs,
            do_sample=True,
            num_return_sequences=g,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            suppress_tokens=placeholder_token_ids(processor.tokenizer),
        )


def naive_logprobs(model, processor, text: str, image, completions: list[list[int]], forbidden):
    """G rows of prompt + completion, each row carrying the image's pixels (the encoder runs G times)."""
    g, c = len(completions), len(completions[0])
    inputs = processor(text=[text] * g, images=[image] * g, return_tensors="pt")
    comp = torch.tensor(completions)  # [G, C]
    inputs["input_ids"] = torch.cat([inputs["input_ids"], comp], dim=1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(comp)], dim=1)
    inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(comp)], dim=1)
    with torch.no_grad():
        logits = model(**inputs).logits[:, -c - 1 : -1].float()
    logits = logits.masked_fill(forbidden, -torch.inf)
    return torch.log_softmax(logits, -1).gather(-1, comp[..., None]).squeeze(-1)  # [G, C]


def bench_size(lm, workdir: Path, size: int, g: int, new_tokens: int, repeats: int) -> dict:
    model, processor = lm.model, lm.processor
    image, shapes = draw_scene(random.Random(size), size)
    path = workdir / f"scene_{size}.png"
    image.save(path)
    sample = Sample(
        id=f"s{size}",
        question="How many shapes are there?",
        answer=str(len(shapes)),
        answer_type="number",
        image=str(path),
    )
    text = processor.apply_chat_template(render_messages(sample), add_generation_prompt=True, tokenize=False)
    pil = load_image(path)
    params = SamplingParams(completions_per_prompt=g, temperature=1.0, max_new_tokens=new_tokens, seed=0)
    forbidden = forbidden_mask(processor.tokenizer, model.config.text_config.vocab_size)

    def engine(cache):
        eng = HFEngine(model, processor, cache, batch_prompts=1)
        eng.eos_ids = set()  # benchmark only: every completion runs the full length, as in the naive path
        return eng

    t_gen_naive, _ = timed(lambda: naive_generate(model, processor, text, pil, g, new_tokens), repeats)
    cold = []

    def cold_run():
        eng = engine(VisionCache(model, processor))
        out = eng.generate([sample], params)
        cold.append(eng.stats()["rollout/images_encoded"])
        return out

    t_gen_cold, _ = timed(cold_run, repeats)
    warm = engine(VisionCache(model, processor))
    t_gen_warm, groups = timed(lambda: warm.generate([sample], params), repeats)
    warm.reset_stats()
    warm.generate([sample], params)
    stats = warm.stats()

    completions = [c.token_ids for c in groups[0].completions]
    cache = warm.cache
    feats = cache.get([sample.image])
    batch = collate_groups(groups, processor.tokenizer.pad_token_id, model.config.image_token_id)
    t_lp_naive, lp_naive = timed(lambda: naive_logprobs(model, processor, text, pil, completions, forbidden), repeats)
    with torch.no_grad():
        t_lp_cached, lp_cached = timed(lambda: completion_logprobs(model, batch, feats, forbidden), repeats)
    prompt_len = len(groups[0].prompt_ids)
    return {
        "px": size,
        "image_tokens": int(feats[0].embeds.shape[0]),
        "prompt_tokens": prompt_len,
        "gen_naive_ms": t_gen_naive,
        "gen_cold_ms": t_gen_cold,
        "gen_cached_ms": t_gen_warm,
        "lp_naive_ms": t_lp_naive,
        "lp_cached_ms": t_lp_cached,
        "lp_max_abs_diff": float((lp_naive - lp_cached).abs().max()),
        "enc_naive": 2 * g,
        "enc_cold": cold[-1],
        "enc_cached": stats["rollout/images_encoded"],
        "prefill_naive": 2 * g * prompt_len,
        "prefill_cached": stats["rollout/prefill_tokens"] + prompt_len,
    }


def print_table(rows: list[dict], g: int, new_tokens: int) -> None:
    print(f"\nG = {g}, {new_tokens} new tokens, 1 thread; times in ms (fastest of the timed runs).")
    print(
        "| image px | image tokens | prompt tokens | generation naive | generation vlgrpo, cold cache "
        "| generation vlgrpo | log-prob pass naive | log-prob pass vlgrpo "
        "| encoder images / group: naive → cold → cached | prefill tokens / group: naive → vlgrpo |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['px']} | {r['image_tokens']} | {r['prompt_tokens']} | {r['gen_naive_ms']:.0f} "
            f"| {r['gen_cold_ms']:.0f} | {r['gen_cached_ms']:.0f} | {r['lp_naive_ms']:.0f} | {r['lp_cached_ms']:.0f} "
            f"| {r['enc_naive']} → {r['enc_cold']} → {r['enc_cached']} "
            f"| {r['prefill_naive']} → {r['prefill_cached']} |"
        )
    worst = max(r["lp_max_abs_diff"] for r in rows)
    print(f"\nmax |log-prob naive - cached| over all sizes: {worst:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="112,448,672", help="square image sides in pixels, comma-separated")
    ap.add_argument("--g", type=int, default=8, help="completions per prompt")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (after one warm-up)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        lm = load_model(str(init_tiny(Path(tmp) / "model", "qwen2_5_vl", spec=SPEC)), max_pixels=SPEC.max_pixels)
        n_params = sum(p.numel() for p in lm.model.parameters())
        print(f"tiny Qwen2.5-VL: {n_params / 1e6:.2f} M parameters")
        rows = [bench_size(lm, Path(tmp), int(s), a.g, a.new_tokens, a.repeats) for s in a.sizes.split(",")]
    print_table(rows, a.g, a.new_tokens)


if __name__ == "__main__":
    main()
