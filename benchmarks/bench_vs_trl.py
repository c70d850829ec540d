"""Seconds per GRPO step: TRL's GRPOTrainer vs vlgrpo, on one tiny Qwen-VL with real proportions, one CPU thread.

Both trainers run in one process, one step each in turn (TRL step k, vlgrpo step k, TRL step k+1, ...), so a change in
machine load hits both alike; the table gives medians over the timed steps after a warm-up. Encoder images and
prompt tokens are counted by the same forward hooks on both models (benchmarks/bench_counting.py).
Usage:
  OMP_NUM_THREADS=1 python benchmarks/bench_vs_trl.py [--arch qwen3_vl --steps 5 --warmup 2 --settings lora/0,full/0.04]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper module next to this script
from bench_counting import PassCounter, PhaseTimer  # noqa: E402

from vlgrpo.config import load_config  # noqa: E402
from vlgrpo.data.adapters import load_samples  # noqa: E402
from vlgrpo.data.prompts import render_messages  # noqa: E402
from vlgrpo.data.synth import synth_dataset  # noqa: E402
from vlgrpo.models import count_parameters, load_model  # noqa: E402
from vlgrpo.policy.prefill import core_model  # noqa: E402
from vlgrpo.rewards import score  # noqa: E402
from vlgrpo.tiny import TinySpec, init_tiny  # noqa: E402
from vlgrpo.trainer.lora import target_regex  # noqa: E402
from vlgrpo.trainer.metrics import memory_metrics  # noqa: E402

# A 7B's proportions at ~4 M parameters: the vision tower (merger included) is ~9% of the parameters (Qwen2.5-VL-7B:
# 0.67 B of 8.3 B), 2x2 patches merge into one token, and a 448 px image gives 256 image tokens of a ~340-token prompt.
SPEC = TinySpec(
    hidden_size=192,
    num_layers=8,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=576,
    vision_hidden=64,
    vision_depth=4,
    vision_heads=2,
    vision_intermediate=160,
    max_pixels=28 * 28 * 1280,
)
# An 8B's proportions at ~3.9 M parameters: Qwen3-VL-8B has 8.77 B parameters, 0.58 B (6.6%) in the vision tower and
# its mergers, 4 query heads per KV head, untied LM head, DeepStack on with 3 maps; 16 px patches merge 2x2, so a 448 px
# image gives 14x14 = 196 image tokens. Here: vision tower + 4 mergers 0.27 M of 3.85 M (6.9%).
SPEC_QWEN3 = TinySpec(
    hidden_size=192,
    num_layers=8,
    num_heads=4,
    num_kv_heads=1,
    intermediate_size=576,
    vision_hidden=32,
    vision_depth=4,
    vision_heads=2,
    vision_intermediate=96,
    max_pixels=28 * 28 * 1280,
    deepstack_visual_indexes=(0, 1, 2),
    tie_word_embeddings=False,
)
# A 9B's proportions: Qwen3.5-9B has 9.41 B parameters, 0.46 B (4.9%) in the vision tower and merger; 32 layers of
# width 4096, every fourth gated attention (16 heads / 4 KV heads of 256 = the width, a quarter rotated), the others
# Gated DeltaNet (16 key / 32 value heads of 128: value width = the width), an untied LM head; no DeepStack. Here: 8
# layers of width 192 (6 Gated DeltaNet, 2 attention), 4 heads / 1 KV head of 48, 2 key / 4 value heads of 48.
SPEC_QWEN3_5 = TinySpec(
    hidden_size=192,
    num_layers=8,
    num_heads=4,
    num_kv_heads=1,
    head_dim=48,
    intermediate_size=576,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=48,
    linear_value_head_dim=48,
    vision_hidden=32,
    vision_depth=4,
    vision_heads=2,
    vision_intermediate=96,
    max_pixels=28 * 28 * 1280,
    tie_word_embeddings=False,
)
# Qwen3-VL-30B-A3B's proportions: 48 layers of width 2048, 32 query heads per 4 KV heads of 128, every layer 128
# experts of width 768 (0.375 of the width), top-8 (1/16 of them); DeepStack, untied head. Here: 8 layers of width
# 192, 4 query heads per KV head, 32 experts of width 72 (0.375), top-2 (1/16).
SPEC_QWEN3_VL_MOE = replace(SPEC_QWEN3, num_experts=32, experts_per_token=2, moe_intermediate_size=72)
SPECS = {"qwen2_5_vl": SPEC, "qwen3_vl": SPEC_QWEN3, "qwen3_5": SPEC_QWEN3_5, "qwen3_vl_moe": SPEC_QWEN3_VL_MOE}
"""--arch -> the tiny model's spec (each keeps max_pixels above a 448 px image, so it is never resized)."""
ARCH_NAMES = {"qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL", "qwen3_5": "Qwen3.5", "qwen3_vl_moe": "Qwen3-VL-MoE"}
LR, CLIP = 1e-5, 0.2
PHASES = ("vision", "rollout", "reward", "advantage", "old_logprob", "ref_logprob", "update", "sync")
ROLLOUT_PARTS = PhaseTimer()
"""vlgrpo's rollout split into its prompt prefill and its decode loop (the two functions of vlgrpo.rollout.hf)."""


BACKENDS = ("lora", "full", "full+vision")
"""lora: adapters on the language model; full: every language-model weight, vision tower and merger frozen (vlgrpo's
default); full+vision: every weight, vision tower and merger included (TRL's default for a full fine-tune)."""


@dataclass
class Setting:
    backend: str  # one of BACKENDS
    beta: float

    @property
    def name(self) -> str:
        return f"{self.backend}, β = {self.beta:g}"


@dataclass
class Record:
    """Per-step measurements of one trainer in one setting."""

    seconds: list[float] = field(default_factory=list)
    counts: list[dict] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    own: list[dict] = field(default_factory=list)  # the trainer's own counters and step time


def parse_settings(text: str) -> list[Setting]:
    out = []
    for item in text.split(","):
        backend, _, beta = item.strip().partition("/")
        if backend not in BACKENDS or not beta:
            raise SystemExit(f"--settings: '{item}' must look like lora/0 or full/0.04 ({'|'.join(BACKENDS)} / beta)")
        out.append(Setting(backend, float(beta)))
    return out


# ---------------------------------------------------------------- the two trainers


def build_vlgrpo(model_dir: Path, train: Path, run_dir: Path, s: Setting, a):
    from vlgrpo.trainer.loop import Trainer
    from vlgrpo.trainer.state import build_state

    overrides = [
        f"model.name_or_path={model_dir}",
        f"model.max_pixels={SPEC.max_pixels}",
        f"data.train={train}",
        f"train.backend={'lora' if s.backend == 'lora' else 'plain'}",
        f"grpo.beta={s.beta}",
        "grpo.aggregation=seq-mean-token-mean",
        f"grpo.clip_low={CLIP}",
        f"grpo.clip_high={CLIP}",
        f"rollout.completions_per_prompt={a.g}",
        f"rollout.max_new_tokens={a.new_tokens}",
        f"train.prompts_per_step={a.prompts}",
        f"train.micro_batch_completions={a.prompts * a.g}",
        f"train.lr={LR}",
        f"train.steps={a.warmup + a.steps}",
        f"train.output_dir={run_dir}",
        "train.resume=false",
        "logging.progress_bar=false",
        "data.shuffle=false",
    ]
    if s.backend == "full+vision":
        overrides += ["model.freeze_vision=false", "model.freeze_merger=false"]
    state = build_state(load_config(None, overrides), run_dir, progress=False)
    state.engine.eos_ids = set()  # benchmark only: every completion runs the full length, as TRL's min_new_tokens
    return Trainer(state), state


def trl_reward_fn(state):
    """vlgrpo's own reward (the same recipe and context), in TRL's `f(completions, **columns)` form."""
    by_id = {x.id: x for x in state.data.samples}

    def vlgrpo_reward(completions, sample_id, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return list(score(texts, [by_id[i] for i in sample_id], state.recipe, state.reward_ctx).total)

    return vlgrpo_reward


def build_trl(model_dir: Path, state, run_dir: Path, s: Setting, a, callback):
    import datasets
    from peft import LoraConfig
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = state.cfg
    rows = [(x, render_messages(x, cfg.data.answer_format, state.reward_ctx.box_format)) for x in state.data.samples]
    ds = datasets.Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": m[-1]["content"][1]["text"]}] for _, m in rows],  # image goes first
            "image": [x.image for x, _ in rows],
            "sample_id": [x.id for x, _ in rows],
        }
    ).cast_column("image", datasets.Image())
    lm = load_model(str(model_dir), max_pixels=SPEC.max_pixels)
    peft_config = None
    if s.backend == "lora":
        lc = cfg.train.lora
        peft_config = LoraConfig(
            r=lc.rank,
            lora_alpha=lc.alpha,
            lora_dropout=lc.dropout,
            bias="none",
            target_modules=target_regex(lc.target_modules),
        )
    elif s.backend == "full":  # the language model trains, the vision tower and merger stay frozen
        for p in core_model(lm.model).visual.parameters():
            p.requires_grad_(False)
    args = GRPOConfig(
        output_dir=str(run_dir),
        per_device_train_batch_size=a.prompts * a.g,
        gradient_accumulation_steps=1,
        num_generations=a.g,
        max_completion_length=a.new_tokens,
        generation_kwargs={"min_new_tokens": a.new_tokens},
        temperature=1.0,
        beta=s.beta,
        loss_type="grpo",
        epsilon=CLIP,
        learning_rate=LR,
        lr_scheduler_type="constant",
        max_grad_norm=cfg.train.max_grad_norm,
        max_steps=a.warmup + a.steps,
        use_vllm=False,
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=lm.model,
        reward_funcs=[trl_reward_fn(state)],
        args=args,
        train_dataset=ds,
        processing_class=lm.processor,
        peft_config=peft_config,
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)  # no log dict on stdout
    return trainer, lm.model


def attach_counter(counter: PassCounter, policy, reference) -> None:
    counter.attach(policy)
    if reference is not None and core_model(reference) is not core_model(policy):
        counter.attach(reference)  # a separate frozen copy: its passes count too


# ---------------------------------------------------------------- alternating steps


def vlgrpo_stepper(trainer, state, counter: PassCounter, rec: Record):
    """One vlgrpo step as `Trainer.train()` runs it (without its final checkpoint), recorded into `rec`."""

    def step() -> None:
        t0 = time.perf_counter()
        metrics = trainer.step_fn()
        metrics.update(state.timers.pop())
        own = {**state.cache.stats(), **state.engine.stats()}
        state.cache.reset_stats()
        state.engine.reset_stats()
        metrics.update(memory_metrics())
        state.logger.log(state.step, metrics)
        rec.seconds.append(time.perf_counter() - t0)
        rec.counts.append(counter.pop())
        rec.phases.append({k[len("timing/") :]: v for k, v in metrics.items() if k.startswith("timing/")})
        rec.phases[-1].update({f"rollout.{k}": v for k, v in ROLLOUT_PARTS.pop().items()})
        rec.lengths.append(metrics["grpo/response_length"])
        rec.own.append({"images_encoded": own["images_encoded"], "prefill_tokens": own["rollout/prefill_tokens"]})

    return step


class Alternate(TrainerCallback):
    """After each TRL optimiser step: record it, then run one vlgrpo step outside TRL's clock."""

    def __init__(self, threads: int, rec: Record, vlgrpo_step) -> None:
        self.threads, self.rec, self.vlgrpo_step = threads, rec, vlgrpo_step
        self.count: PassCounter | None = None  # set once the TRL model is built
        self.phases = PhaseTimer()
        self.t = 0.0

    def on_train_begin(self, *args, **kwargs):
        torch.set_num_threads(self.threads)  # in case TRL or accelerate changed it
        self.t = time.perf_counter()

    def on_step_end(self, *args, **kwargs):
        self.rec.seconds.append(time.perf_counter() - self.t)
        self.rec.counts.append(self.count.pop())
        self.rec.phases.append(self.phases.pop())
        self.vlgrpo_step()
        self.t = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.rec.lengths.append(float(logs["completions/mean_length"]))
            self.rec.own.append({"step_time": float(logs.get("step_time", math.nan))})


def run_setting(workdir: Path, model_dir: Path, train: Path, s: Setting, a) -> dict:
    tag = f"{s.backend}-{s.beta:g}"
    trainer, state = build_vlgrpo(model_dir, train, workdir / f"vlgrpo-{tag}", s, a)
    prompts = [state.rows.prompt(x).input_ids for x in state.data.samples]
    vl_count = PassCounter(prompts, state.image_token_id, state.pad_id)
    with state.backend.reference() as ref:
        attach_counter(vl_count, state.lm.model, ref)
    trl_rec, vl_rec = Record(), Record()
    alternate = Alternate(a.threads, trl_rec, vlgrpo_stepper(trainer, state, vl_count, vl_rec))
    trl, trl_model = build_trl(model_dir, state, workdir / f"trl-{tag}", s, a, alternate)
    alternate.count = PassCounter(prompts, state.image_token_id, state.pad_id)
    attach_counter(alternate.count, trl_model, trl.ref_model)
    alternate.phases.wrap(trl, "_generate", "generate")  # processor + model.generate
    alternate.phases.wrap(trl, "_generate_and_score_completions", "rollout_and_score")  # + processor, ref, reward
    ROLLOUT_PARTS.pop()
    trl.train()
    if a.profile_rollout:
        profile_rollout(state, a)
    return summarise(s, trl_rec, vl_rec, a.warmup)


def profile_rollout(state, a) -> None:
    """torch.profiler over one vlgrpo rollout of fresh prompts (features cached first): where its time goes."""
    from torch.profiler import ProfilerActivity, profile

    samples = state.rows.draw(a.prompts)
    state.cache.get([x.image for x in samples])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        state.engine.generate(samples, state.sampling_for(10_000))
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in ops)
    print(
        f"\n[profile] one vlgrpo rollout ({a.prompts} prompts x G = {a.g}, {a.new_tokens} tokens): {total / 1e6:.3f} s "
        "of op time; top ops (share, ms, calls):"
    )
    print(
        "  "
        + "; ".join(
            f"{e.key} {100 * e.self_cpu_time_total / total:.0f}% {e.self_cpu_time_total / 1e3:.0f} {e.count}"
            for e in ops[:6]
        )
    )
    by_shape = sorted(
        (e for e in prof.key_averages(group_by_input_shape=True) if e.key in ("aten::copy_", "aten::cat")),
        key=lambda e: -e.self_cpu_time_total,
    )
    print(
        "  largest copies (op, input shapes, ms, calls): "
        + "; ".join(f"{e.key} {e.input_shapes[:1]} {e.self_cpu_time_total / 1e3:.0f} {e.count}" for e in by_shape[:4])
    )


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


def summarise(s: Setting, trl: Record, vl: Record, warmup: int) -> dict:
    def per_step(rec: Record, key: str) -> float:
        return _median(c[key] for c in rec.counts[warmup:])

    t_trl, t_vl = trl.seconds[warmup:], vl.seconds[warmup:]
    timed = vl.phases[warmup:]
    phases = {p: _median(ph.get(p, 0.0) for ph in timed) for p in PHASES}
    phases["other"] = _median(t - sum(ph.get(p, 0.0) for p in PHASES) for t, ph in zip(t_vl, timed))
    for part in ("rollout.prefill", "rollout.decode"):
        phases[part] = _median(ph.get(part, 0.0) for ph in timed)
    gen = [ph.get("generate", 0.0) for ph in trl.phases[warmup:]]
    score = [ph.get("rollout_and_score", 0.0) for ph in trl.phases[warmup:]]
    trl_parts = {
        "generate": _median(gen),
        "scoring": _median(b - g for g, b in zip(gen, score)),
        "update": _median(t - b for t, b in zip(t_trl, score)),
    }
    step_ratios = [v / t for v, t in zip(t_vl, t_trl)]
    return {
        "setting": s.name,
        "backend": s.backend,
        "beta": s.beta,
        "timed_steps": len(t_trl),
        "trl_s": _median(t_trl),
        "vlgrpo_s": _median(t_vl),
        "ratio": _median(t_vl) / _median(t_trl),
        "step_ratio_min": min(step_ratios, default=math.nan),
        "step_ratio_max": max(step_ratios, default=math.nan),
        "trl_s_all": trl.seconds,
        "vlgrpo_s_all": vl.seconds,
        "trl_own_step_time": _median(o["step_time"] for o in trl.own[warmup:]),
        "trl_images": per_step(trl, "images_encoded"),
        "vlgrpo_images": per_step(vl, "images_encoded"),
        "trl_encoder_calls": per_step(trl, "encoder_calls"),
        "vlgrpo_encoder_calls": per_step(vl, "encoder_calls"),
        "trl_prefill": per_step(trl, "prompt_tokens"),
        "vlgrpo_prefill": per_step(vl, "prompt_tokens"),
        "trl_decode_s": per_step(trl, "decode_seconds"),
        "vlgrpo_decode_s": per_step(vl, "decode_seconds"),
        "trl_decode_forwards": per_step(trl, "decode_forwards"),
        "vlgrpo_decode_forwards": per_step(vl, "decode_forwards"),
        "vlgrpo_own_images": _median(o["images_encoded"] for o in vl.own[warmup:]),
        "vlgrpo_own_rollout_prefill": _median(o["prefill_tokens"] for o in vl.own[warmup:]),
        "trl_length": _median(trl.lengths[warmup:]),
        "vlgrpo_length": _median(vl.lengths[warmup:]),
        "vlgrpo_phases": phases,
        "trl_parts": trl_parts,
    }


# ---------------------------------------------------------------- report


def print_report(rows: list[dict], a, params: dict) -> None:
    print(
        f"\ntiny {ARCH_NAMES[a.arch]}: {params['total'] / 1e6:.2f} M parameters, vision tower "
        f"{params['vision'] / 1e6:.2f} M "
        f"({100 * params['vision'] / params['total']:.1f}%); {a.image_size} px images, G = {a.g}, "
        f"{a.prompts} prompts/step, {a.new_tokens} new tokens, fp32, {a.threads} thread(s); "
        f"medians of {a.steps} steps after {a.warmup} warm-up steps.\n"
    )
    print(
        "| setting | TRL s/step | vlgrpo s/step | vlgrpo / TRL (per-step range) | encoder images / step: TRL → vlgrpo "
        "| prompt tokens forwarded / step: TRL → vlgrpo | mean completion length: TRL, vlgrpo |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['setting']} | {r['trl_s']:.2f} | {r['vlgrpo_s']:.2f} | {r['ratio']:.2f} "
            f"({r['step_ratio_min']:.2f}–{r['step_ratio_max']:.2f}) "
            f"| {r['trl_images']:.0f} → {r['vlgrpo_images']:.0f} | {r['trl_prefill']:.0f} → {r['vlgrpo_prefill']:.0f} "
            f"| {r['trl_length']:.1f}, {r['vlgrpo_length']:.1f} |"
        )
    print(
        "\nCross-checks (medians per step): vlgrpo's own vision/images_encoded and rollout/prefill_tokens; "
        "encoder calls (hooks) TRL → vlgrpo; decode-step forwards (hooks; one new token per row), count and "
        "seconds, TRL → vlgrpo; TRL's own `step_time` log vs this script's clock."
    )
    for r in rows:
        print(
            f"- {r['setting']}: vlgrpo counters {r['vlgrpo_own_images']:.0f} images, "
            f"{r['vlgrpo_own_rollout_prefill']:.0f} rollout prefill tokens; encoder calls "
            f"{r['trl_encoder_calls']:.0f} → {r['vlgrpo_encoder_calls']:.0f}; decode forwards "
            f"{r['trl_decode_forwards']:.0f} in {r['trl_decode_s']:.2f} s → {r['vlgrpo_decode_forwards']:.0f} in "
            f"{r['vlgrpo_decode_s']:.2f} s; TRL step_time "
            f"{r['trl_own_step_time']:.2f} s vs {r['trl_s']:.2f} s"
        )
    cols = (*PHASES, "other")
    print("\nvlgrpo step by phase (timing/*, median seconds; other = step − phases, per step):")
    print("| setting | " + " | ".join(cols) + " | step |")
    print("|---|" + "---:|" * (len(cols) + 1))
    for r in rows:
        ph = r["vlgrpo_phases"]
        print(f"| {r['setting']} | " + " | ".join(f"{ph[p]:.3f}" for p in cols) + f" | {r['vlgrpo_s']:.3f} |")
    print("\nvlgrpo rollout split (median seconds): prompt prefill (once per prompt) and the decode loop (G rows).")
    for r in rows:
        ph = r["vlgrpo_phases"]
        print(
            f"- {r['setting']}: prefill {ph['rollout.prefill']:.3f}, decode {ph['rollout.decode']:.3f}, "
            f"rollout {ph['rollout']:.3f}"
        )
    print(
        "\nTRL step by part (median seconds): generate = processor + model.generate; scoring = the rest of "
        "_generate_and_score_completions (processor again, reference pass, reward); update = the rest of the step."
    )
    for r in rows:
        p = r["trl_parts"]
        print(
            f"- {r['setting']}: generate {p['generate']:.2f}, scoring {p['scoring']:.2f}, "
            f"update {p['update']:.2f}, step {r['trl_s']:.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=tuple(SPECS), default="qwen2_5_vl", help="the tiny model's architecture")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per trainer and setting")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--settings", default="lora/0,lora/0.04,full/0,full/0.04", help="backend/beta, comma-separated")
    ap.add_argument(
        "--image-size", type=int, default=448, help="square image side in pixels (448 -> 256 tokens; 196 for qwen3_vl)"
    )
    ap.add_argument("--g", type=int, default=8, help="completions per prompt")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens per completion (EOS suppressed in both)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--profile-rollout", action="store_true", help="after each setting, profile one vlgrpo rollout")
    a = ap.parse_args()
    settings = parse_settings(a.settings)
    import vlgrpo.rollout.hf as hf

    ROLLOUT_PARTS.wrap(hf, "prefill", "prefill")  # module globals: HFEngine looks them up at call time
    ROLLOUT_PARTS.wrap(hf, "decode_loop", "decode")
    torch.set_num_threads(a.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = init_tiny(work / "model", a.arch, spec=SPECS[a.arch])
        # both trainers read the training set in file order (no shuffle): step k has the same two prompts in both,
        # and no image repeats within the run, so vlgrpo's vision cache never hits across steps
        n = math.ceil((a.warmup + a.steps) * a.prompts / 0.8) + 4
        train = synth_dataset(work / "data", n, seed=0, image_size=a.image_size)["train"]
        if len(load_samples(train).samples) < (a.warmup + a.steps) * a.prompts:
            raise SystemExit("internal: too few training samples for the steps asked")
        params = count_parameters(load_model(str(model_dir)).model)
        rows = []
        for s in settings:
            print(f"[bench] {s.name} ...", file=sys.stderr, flush=True)
            rows.append(run_setting(work, model_dir, train, s, a))
    print_report(rows, a, params)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "params": params, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
