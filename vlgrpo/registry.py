"""Every choice a run makes among implementations, one registry each: the names the config accepts, the CLI offers
and the configuration reference lists, one line of help per option, and where each option is implemented
("module:attribute", imported on first use, so naming `zero3` does not import DeepSpeed).

Adding an option (a rollout engine, an eval suite, a ratio) is its implementation plus one line here; the config
validation, the CLI and docs/configuration.md read these tables, and tests/test_registry.py checks that every target
imports and that the config's choices are these names. Old names of a renamed option are accepted with a
deprecation message (`aliases`). Imports nothing of vlgrpo: every layer may read it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    name: str
    target: str | None
    """"package.module:attribute" implementing the option; None for a value that selects no object ("auto")."""
    help: str
    aliases: tuple[str, ...] = ()
    """Former names, still accepted with a deprecation message."""


class Registry:
    """The options of one config key, in the order the docs list them."""

    def __init__(self, key: str, *options: Option) -> None:
        self.key, self.options = key, {o.name: o for o in options}
        self.aliases = {a: o.name for o in options for a in o.aliases}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.options)

    def canonical(self, name: str) -> tuple[str, str | None]:
        """(the current name, a deprecation message or None) for a name or a former name; unknown names are
        returned unchanged (validation rejects them with the accepted list)."""
        if name in self.aliases:
            new = self.aliases[name]
            return new, f"{self.key}={name!r} is deprecated: it is now {self.key}={new!r}"
        return name, None

    def load(self, name: str):
        """The object implementing option `name` (imported now); ValueError naming the key and the names."""
        option = self.options.get(self.canonical(name)[0])
        if option is None or option.target is None:
            loadable = ", ".join(n for n, o in self.options.items() if o.target)
            raise ValueError(f"{self.key}={name!r} is not one of {loadable}")
        module, attribute = option.target.split(":")
        return getattr(importlib.import_module(module), attribute)


MODEL_ARCH = Registry(
    "model.arch",
    Option("auto", None, "read from the checkpoint's config.json (model_type)"),
    Option("qwen2_vl", "vlgrpo.models:QWEN2_VL", "Qwen2-VL: boxes (x1,y1),(x2,y2) on 0-1000"),
    Option("qwen2_5_vl", "vlgrpo.models:QWEN2_5_VL", "Qwen2.5-VL: boxes as bbox_2d in pixels of the resized input"),
    Option(
        "qwen3_vl",
        "vlgrpo.models:QWEN3_VL",
        "Qwen3-VL (dense): DeepStack features cached with the image's; boxes as bbox_2d on 0-1000",
    ),
    Option(
        "qwen3_5",
        "vlgrpo.models:QWEN3_5",
        "Qwen3.5 (dense): Gated DeltaNet + gated attention, Qwen3-VL's tower without DeepStack; bbox_2d on 0-1000",
    ),
    Option(
        "qwen3_vl_moe",
        "vlgrpo.models:QWEN3_VL_MOE",
        "Qwen3-VL mixture of experts (30B-A3B, 235B-A22B): Qwen3-VL with top-k routed experts in every layer",
    ),
    Option(
        "qwen3_5_moe",
        "vlgrpo.models:QWEN3_5_MOE",
        "Qwen3.5 mixture of experts (35B-A3B, 122B-A10B): Qwen3.5 with routed experts and a gated shared expert",
    ),
)
BACKEND = Registry(
    "train.backend",
    Option("plain", "vlgrpo.trainer.backends:PlainBackend", "full fine-tuning, one process or DDP"),
    Option(
        "lora",
        "vlgrpo.trainer.lora:LoRABackend",
        "PEFT LoRA on the language model; the reference policy is the adapter switched off",
    ),
    Option(
        "zero3",
        "vlgrpo.trainer.zero3:Zero3Backend",
        "DeepSpeed ZeRO-3: parameters, gradients and optimiser state partitioned over the ranks",
    ),
)
ENGINE = Registry(
    "rollout.engine",
    Option("hf", "vlgrpo.rollout.hf:HFEngine", "transformers generate on the training model (no weight sync)"),
    Option(
        "vllm", "vlgrpo.rollout.vllm.engine:VLLMEngine", "vLLM with prefix caching; weights synced after each update"
    ),
)
TOOL = Registry(
    "rollout.tools",
    Option(
        "zoom_in",
        "vlgrpo.rollout.tools.zoom:ZOOM_IN",
        "the region of an image inside a box comes back as a new image (the model calls it image_zoom_in_tool)",
    ),
)
"""A list key: each name one of these or a user function, module:function or path/to/file.py:function."""
ADVANTAGE = Registry(
    "grpo.advantage",
    Option("group", "vlgrpo.grpo.advantages:group_advantages", "(r - group mean) / (group std + eps): GRPO"),
    Option("group_mean", "vlgrpo.grpo.advantages:group_mean_advantages", "r - group mean: Dr.GRPO"),
    Option("batch", "vlgrpo.grpo.advantages:batch_advantages", "(r - group mean) / (batch std + eps): REINFORCE++"),
)
RATIO = Registry(
    "grpo.ratio",
    Option(
        "token",
        "vlgrpo.grpo.losses:token_log_ratio",
        "one importance ratio per token: GRPO, DAPO, Dr.GRPO",
        aliases=("grpo",),
    ),
    Option(
        "sequence",
        "vlgrpo.grpo.losses:sequence_log_ratio",
        "the length-normalised sequence ratio at every token: GSPO",
        aliases=("gspo",),
    ),
    Option(
        "sequence_token",
        "vlgrpo.grpo.losses:sequence_token_log_ratio",
        "the sequence ratio's value with per-token gradients: GSPO-token",
        aliases=("gspo_token",),
    ),
)
AGGREGATION = Registry(
    "grpo.aggregation",
    Option("token-mean", "vlgrpo.grpo.losses:token_mean", "mean over every token of the batch: DAPO"),
    Option(
        "seq-mean-token-mean", "vlgrpo.grpo.losses:seq_mean_token_mean", "mean over tokens, then over sequences: GRPO"
    ),
    Option(
        "seq-mean-token-sum-norm",
        "vlgrpo.grpo.losses:seq_mean_token_sum_norm",
        "token sum / max_new_tokens, mean over sequences: Dr.GRPO",
    ),
)
DATA_FORMAT = Registry(
    "data.format",
    Option("auto", None, "from the path: .jsonl, a saved HF dataset, .parquet or an image folder"),
    Option("jsonl", "vlgrpo.data.adapters:read_jsonl", "one JSON row per line (or one JSON array)"),
    Option("hf", "vlgrpo.data.adapters:read_hf", "a dataset saved with save_to_disk, or a Dataset object"),
    Option("parquet", "vlgrpo.data.adapters:read_parquet", "a parquet file (images as bytes or paths)"),
    Option("folder", "vlgrpo.data.adapters:read_folder", "an image folder with labels.jsonl or labels.csv"),
)
DATA_PRESET = Registry(
    "data.preset",
    Option("none", None, "rows already in vlgrpo's schema (data.columns may rename fields)"),
    Option("llava", "vlgrpo.data.presets:llava", "LLaVA conversations (from/value turns, <image> marker)"),
    Option("messages", "vlgrpo.data.presets:messages", "chat messages with typed content parts (TRL, OpenAI)"),
    Option("r1v", "vlgrpo.data.presets:r1v", "R1-V / VLM-R1 / Visual-RFT: image, problem, solution"),
    Option("easyr1", "vlgrpo.data.presets:easyr1", "EasyR1: images (a list), problem with <image>, answer"),
    Option(
        "deepeyes",
        "vlgrpo.data.presets:deepeyes",
        "DeepEyes-47k (verl's RL rows): prompt messages with <image>, images, reward_model.ground_truth",
    ),
)
BOX_FORMAT = Registry(
    "reward.box_format",
    Option("auto", None, "the model family's own convention (model.arch)"),
    Option("qwen2", "vlgrpo.rewards.boxes:QWEN2", "(x1,y1),(x2,y2) on 0-1000 (Qwen2-VL)"),
    Option("qwen2_5", "vlgrpo.rewards.boxes:QWEN2_5", "bbox_2d in pixels of the processor-resized image (Qwen2.5-VL)"),
    Option("qwen3", "vlgrpo.rewards.boxes:QWEN3", "bbox_2d on 0-1000 (Qwen3-VL)"),
    Option("plain", "vlgrpo.rewards.boxes:PLAIN", "[x1, y1, x2, y2] in original-image pixels"),
)
EVAL_SUITE = Registry(
    "eval.suites",
    Option(
        "pope",
        "vlgrpo.evals.pope.suite:SUITE",
        "POPE yes/no object probes: accuracy, precision, recall, F1, yes-ratio per split",
    ),
    Option("grounding", "vlgrpo.evals.grounding:SUITE", "referring-expression boxes: Acc@0.5, Acc@0.75, mIoU"),
    Option("vqa", "vlgrpo.evals.vqa:SUITE", "verifiable answers (number, choice, yes/no, text, math): accuracy"),
    Option(
        "mathvista",
        "vlgrpo.evals.reasoning.suite:MATHVISTA",
        "MathVista (testmini) by its own normalisation: accuracy overall, per task and skill",
    ),
    Option(
        "geometry3k",
        "vlgrpo.evals.reasoning.suite:GEOMETRY3K",
        "Geometry3K (EasyR1's copy) by math_verify equivalence: accuracy",
    ),
    Option(
        "superclevr",
        "vlgrpo.evals.reasoning.suite:SUPERCLEVR",
        "SuperCLEVR counting (R1-V's 200-question test file) by exact count: accuracy",
    ),
    Option(
        "mmmu",
        "vlgrpo.evals.reasoning.suite:MMMU",
        "MMMU (val) by its option-letter and open-answer parsing: "
        "accuracy overall, per discipline and subject (single-image rows)",
    ),
    Option(
        "vstar",
        "vlgrpo.evals.vstar:SUITE",
        "V* Bench (direct_attributes, relative_position folders) by the option letter or text: accuracy overall and "
        "per category",
    ),
)
POPE_PARSER = Registry(
    "eval.pope_parser",
    Option(
        "pope", "vlgrpo.evals.pope.score:parse_pope", "the original POPE rule (no iff No/not/no in the first sentence)"
    ),
    Option(
        "vlmevalkit",
        "vlgrpo.evals.pope.score:parse_vlmevalkit",
        "VLMEvalKit's YOrN_Extraction (yes xor no, else unknown)",
    ),
    Option("strict", "vlgrpo.evals.pope.score:parse_strict", "exactly yes or no, else unknown"),
)

REGISTRIES = (
    MODEL_ARCH,
    BACKEND,
    ENGINE,
    TOOL,
    ADVANTAGE,
    RATIO,
    AGGREGATION,
    DATA_FORMAT,
    DATA_PRESET,
    BOX_FORMAT,
    EVAL_SUITE,
    POPE_PARSER,
)
BY_KEY = {r.key: r for r in REGISTRIES}
