"""The model card (README.md) of a model built by dev/pretrain_tiny.py: every figure read from its pretrain.json.

.venv/bin/python dev/pretrain_tiny.py --card-only     # rewrite README.md from pretrain.json
"""

from __future__ import annotations

from fractions import Fraction

CAPTION_ROWS = (
    ("first_colour", "first object's colour"),
    ("first_shape", "first object's shape"),
    ("count", "object count"),
    ("all_objects", "all objects named (colour + shape multiset)"),
    ("box_iou50", "gold boxes matched by a predicted box, IoU >= 0.5"),
    ("object_iou50", "gold objects matched by a same-label box, IoU >= 0.5"),
    ("parsed", "captions that parse"),
    ("names_exact", "name lists exactly right (`{names}`)"),
)
INSTRUCTION_ROWS = (
    ("list_colour", "`List the <colour> shapes.`: exactly right"),
    ("list_colour_none", "... `none` when no shape has that colour"),
    ("list_shape", "`List each <kind>.`: exactly right"),
    ("list_shape_none", "... `none` when no shape is of that kind"),
    ("list_name", "`List each <colour> <kind>.`: exactly right"),
    ("list_name_none", "... `none` when no shape has that name"),
    ("find_name", "`Find each <colour> <kind>.`: asked shapes found, label right and IoU >= 0.5"),
    ("find_name_none", "... `none` when no shape has that name"),
)


TASK_NAMES = {
    "boxes": "grounding captions",
    "names": "name lists",
    "list_colour": "`List the <colour> shapes.`",
    "list_shape": "`List each <kind>.`",
    "list_name": "`List each <colour> <kind>.`",
    "find_name": "`Find each <colour> <kind>.` (their grounding JSON)",
}


def _mix(f: dict) -> str:
    """Stage 3's task shares, e.g. "grounding captions 1 in 6, name lists 1 in 12, ..."."""
    mix = f["instruct_mix"]
    shares = [(t, Fraction(mix.count(t), len(mix))) for t in dict.fromkeys(mix)]
    return ", ".join(f"{TASK_NAMES[t]} {q.numerator} in {q.denominator}" for t, q in shares)


def stage0_summary(log: list[dict]) -> str:
    last = [e for e in log if "stage0_step" in e]
    if not last:
        return "stage 0 skipped"
    e = last[-1]
    return (
        f"per-token colour accuracy {e['cell_colour_acc']:.3f}, shape accuracy {e['cell_shape_acc']:.3f}, "
        f"absolute box error {e['abs_box_error_px']:.1f} px (training batches of the last 50 steps)"
    )


def _rate(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _wall(f: dict) -> list[str]:
    sec, stage2 = f["seconds"], f.get("stage2", {})
    line = (
        f"- Wall time {sec['total']:.0f} s on one CPU thread (stage 0 {sec['stage0']:.0f} s, stage 1 "
        f"{sec['stage1']:.0f} s, stage 2 {sec['stage2']:.0f} s, stage 3 {sec.get('stage3', 0):.0f} s, in-run evals "
        f"{sec['evals'] + sec.get('stage3_evals', 0):.0f} s, final caption and instruction evals "
        f"{sec['caption_eval']:.0f} s, zero-shot eval {sec['zero_shot_eval']:.0f} s), torch {f['torch']}"
        f"{', CPU kernels ' + f['cpu_capability'] if 'cpu_capability' in f else ''}. The same "
        f"command on the same machine writes the same weights (model.safetensors sha256 `{f['weights_sha256']}`; "
        "`dev/tests/test_pretrain_tiny.py` checks it on short builds, and that a saved stage-2 model gives the same "
        "result as a rebuild)."
    )
    if stage2.get("source", "built here") != "built here":
        line += (
            f" Stages 0-2 were taken from a saved build (`--from-stage2`, stage-2 weights sha256 "
            f"`{stage2['weights_sha256']}`, what the full command's stages 0-2 write); their times are that "
            "build's. The full rebuild, `OMP_NUM_THREADS=1 .venv/bin/python dev/pretrain_tiny.py`, takes "
            "about the total above."
        )
    return [line]


def _stages(f: dict) -> list[str]:
    s = f["settings"]
    streams = f["seed_streams"]
    return [
        f"- Stage 0 (vision encoder): `init_tiny(seed={s['seed']})`, then {s['stage0_steps']} steps x {s['batch']} "
        f"scenes train the tower and merger alone (lr {s['vision0_lr']}, cosine) through a throw-away linear head on "
        "each image token: colour and shape of the object centred in it, objectness, its box within the token and in "
        f"the image. At the end: {stage0_summary(f['loss_log'])}. This stands in for the pretrained CLIP / SigLIP "
        "encoder every real VLM starts from; without it the LM ignored the image (measured: the same loss with the "
        "right, shuffled or blank images after 400 frozen-tower steps, names at chance after 1,200 steps).",
        f"- Merger calibration: `calibrate_merger` (target std {s['merger_std']}) on {s['calibration_images']} "
        "unlabeled scenes.",
        f"- Stage 1 (alignment): {s['stage1_steps']} steps x {s['batch']} captions, vision tower frozen, merger + LM "
        f"at lr {s['lr']} (warmup {s['warmup']}). Stage 2 (whole model): {s['stage2_steps']} steps, merger + LM from "
        f"lr {s['lr2']}, tower from lr {s['vision_lr']}, cosine to 10 %."
        + (
            f' Each prompt is followed by 0-{s["pad_sentences"]} generic sentences ("Be brief.", "Keep the order."),'
            " an experiment (`--pad-sentences`): built so on 2026-12-02, stage 2's caption boxes at IoU >= 0.5 "
            "were 0.01, against 0.367 without."
            if s.get("pad_sentences")
            else ""
        ),
        f"- Stage 3 (instructions, LLaVA's instruction tuning on our own templates): {s.get('stage3_steps', 0)} steps "
        f"x {s['batch']}, vision tower frozen, merger + LM from a fresh optimiser at lr {s.get('lr3', '-')} (warmup, "
        f"cosine to 10 %). Each step one task: {_mix(f)} (target: those shapes' name list, or `none`). These are "
        "the question-conditioned lookups the demo's questions need; the demo's own templates are never trained on."
        + (
            ' Prompts vary (`restyle`): a paraphrase of the instruction ("Box the red circle.", "Which circle is '
            'there?"), 0-3 generic sentences after it ("Be brief."), and one row in two a format to follow: the '
            "target inside a tag (`<res>...</res>`) or the asked shapes' names in one tag, then the target in another "
            "(not `<think>` / `<answer>`): an experiment (`--vary-prompts`), meant to unkey the skills from the "
            "exact prompt."
            if s.get("vary_prompts")
            else ""
        ),
        "- Every stage: AdamW (0.9, 0.98), weight decay 0.01, grad-norm clip 1.0, fresh scenes every step (no scene "
        "repeats).",
        f"- Seed streams (`random.Random`): stage 0 scenes {streams.get('vision')}, caption scenes {streams['train']}, "
        f"stage 3 scenes {streams.get('instruct', '-')}, caption-eval scenes {streams['caption_eval']}, instruction-"
        f"eval scenes {streams.get('instruct_eval', '-')}, calibration scenes {streams['calibration']}, zero-shot "
        f"questions {streams['zero_shot']}. The demo draws `random.Random(seed x 1000 + split)` with small seeds, so "
        "no demo scene (train or test) is seen here for any demo seed below 7e8.",
    ]


def _quality(f: dict) -> list[str]:
    q, before = f["caption_quality"], f.get("stage2", {})
    names = f.get("prompts", {}).get("names", "Name the shapes.")
    out = [
        f"## Caption and instruction quality (greedy, {f['caption_eval_scenes']} held-out scenes each)",
        "",
        "| metric | after stage 2 | final |",
        "|---|---|---|",
    ]
    for key, label in CAPTION_ROWS:
        out.append(
            f"| {label.format(names=names)} | {_rate(before.get('caption_quality', {}).get(key))} | {_rate(q[key])} |"
        )
    for key, label in INSTRUCTION_ROWS:
        out.append(
            f"| {label} | {_rate(before.get('instructions', {}).get(key))} | "
            f"{_rate(f.get('instructions', {}).get(key))} |"
        )
    out += ["", "Examples (gold, then generated; grounding caption and name list):", ""]
    out += [
        f"- `{e['gold']}`\n  `{e['pred']}`\n  `{e['names_gold']}` / `{e['names_pred']}`" for e in f["caption_examples"]
    ]
    return out


def _zero_shot(f: dict) -> list[str]:
    z = f["zero_shot"]
    return [
        "## Zero-shot accuracy on demo-style questions (before any SFT / RL)",
        "",
        "The demo's questions and instructions (`synth.make_sample`, `prompts.instruction` with answer format "
        f"`answer`), {sum(z['questions'].values())} of them from their own held-out scene stream, greedy, 64 new "
        "tokens. Strict: the answer (inside `<answer>` tags, else the whole completion) is exactly the gold answer; "
        "for `ground`, the first box has IoU >= 0.5. Lenient: the first number / colour / yes-no word anywhere in the "
        "completion is the gold answer. The model was never asked the demo's questions, so this measures what "
        "transfers as is; the demo's SFT cold start teaches its answer format.",
        "",
        "| kind | questions | strict | lenient |",
        "|---|---|---|---|",
        *[f"| {k} | {z['questions'][k]} | {z['strict'][k]:.3f} | {z['lenient'][k]:.3f} |" for k in z["questions"]],
        "",
        "Examples:",
        "",
        *[f"- {e['question']} (gold `{e['gold']}`): `{e['completion']}`" for e in z["examples"]],
    ]


def model_card(name: str, f: dict) -> str:
    """README.md of the model directory, every figure read from `f` (pretrain.json)."""
    s, n, spec = f["settings"], f["parameters"], f["settings"]["spec"]
    prompts = f.get("prompts", {"caption": "Detect the shapes.", "names": "Name the shapes."})
    return "\n".join(
        [
            f"# {name}",
            "",
            "A tiny Qwen2.5-VL (the real architecture, processor and chat template; the locally trained 512-token "
            "BPE of "
            "`vlgrpo.tiny.build_tiny_tokenizer`) pretrained on synthetic shapes captions and instructions, so GRPO on "
            "the shapes task starts from a model that already reads images. Built by `dev/pretrain_tiny.py`; loads "
            "with `vlgrpo.models.load_model(path)`.",
            "",
            "## How it was built",
            "",
            "```",
            f["command"],
            "```",
            "",
            *_wall(f),
            f"- {n['total']:,} parameters ({n['vision']:,} in the vision tower and merger, {n['language']:,} in the "
            f"language model); fp32, {f['size_mb']} MB on disk. LM: hidden {spec['hidden_size']}, {spec['num_layers']} "
            f"layers, {spec['num_heads']} heads ({spec['num_kv_heads']} KV), MLP {spec['intermediate_size']}. Vision: "
            f"hidden {spec['vision_hidden']}, depth {spec['vision_depth']}, {spec['vision_heads']} heads, MLP "
            f"{spec['vision_intermediate']}. LM M-RoPE base {spec.get('rope_theta', 10000.0):g}"
            + (
                " (not 10,000: at 10,000 the width axis of the 4 x 4 image-token grid gets frequencies under 0.004 "
                "rad per "
                "token, too low to tell its columns apart; `default_spec` in dev/pretrain_tiny.py)."
                if spec.get("rope_theta", 10000.0) != 10000.0
                else "."
            ),
            f"- Images: {f['image_size']} x {f['image_size']} px scenes ({f['image_tokens']} image tokens after the "
            "2x2 "
            f"merge), 1-{s['max_shapes']} non-overlapping shapes from `vlgrpo.data.synth.draw_scene`. Use this image "
            "size "
            "downstream: boxes and features were learnt at it.",
            "- Caption target, every object left to right in Qwen2.5-VL's grounding convention (`bbox_2d` in pixels of "
            f"the resized input, `rewards.boxes.from_original_pixels`): `{f['caption_examples'][0]['gold']}`; prompt "
            f"`{prompts['caption']}`. One step in {s['names_every']} of stages 1-2 teaches name lists instead (prompt "
            f"`{prompts['names']}`, target e.g. `{f['caption_examples'][0]['names_gold']}`: colour then shape order, "
            "no "
            "positions). No demo question template (count / colour / exist / locate) is ever trained on.",
            *_stages(f),
            "",
            *_quality(f),
            "",
            *_zero_shot(f),
            "",
            "`pretrain.json` holds every figure above, the loss log and the in-run evaluations.",
            "",
            "## Used by",
            "",
            "`vlgrpo demo` (`make demo`) starts from this model (its default `--base`): a short SFT cold start whose "
            "think part lists the shapes the question is about (the stage-3 skill, `meta.reasoning`), then GRPO on "
            "count, colour, exist and ground questions. `docs/demo-seeds.md` has what that does on five seeds.",
            "",
        ]
    )
