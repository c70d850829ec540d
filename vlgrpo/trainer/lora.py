"""LoRA backend: adapters on the language model's linear layers (never the vision tower unless asked).

The only module that imports peft. Reference log-probs come from the same model with the adapter disabled (no second
copy in memory); export merges the adapter into a plain HF checkpoint.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from vlgrpo.config import Config
from vlgrpo.models import is_visual
from vlgrpo.policy.decode_weights import register_decode_weights
from vlgrpo.trainer.backends import PlainBackend, apply_freeze


def target_regex(modules: list[str]) -> str:
    """peft target pattern: the named linear layers of the language model only (full-name regex match).

    Qwen2.5-VL's vision blocks also have gate_proj/up_proj/down_proj; a bare name list would wrap them too.
    Names prefixed with `visual.` (e.g. `visual.merger.mlp.0`) opt a vision layer in explicitly.
    """
    lm = [re.escape(m) for m in modules if not m.startswith("visual.")]
    vis = [re.escape(m[len("visual.") :]) for m in modules if m.startswith("visual.")]
    parts = []
    if lm:
        parts.append(rf".*language_model.*\.({'|'.join(lm)})")
    if vis:
        parts.append(rf".*visual\.({'|'.join(vis)})")
    return "|".join(f"(?:{p})" for p in parts)


def base_name(name: str) -> str:
    """A base-model state name under peft -> the plain model's: every `.base_layer` segment dropped (a MoE's experts
    are wrapped twice, once per fused weight: mlp.experts.base_layer.base_layer.gate_up_proj becomes
    mlp.experts.gate_up_proj)."""
    return re.sub(r"(?:\.base_layer)+\.", ".", name)


def expert_parameters(model) -> list[str]:
    """peft `target_parameters` for every routed expert's fused weights of a MoE model (ValueError for a dense one)."""
    experts = [layer.mlp.experts for layer in model.get_decoder().layers if hasattr(layer.mlp, "experts")]
    if not experts:
        raise ValueError("train.lora.experts=true: the model has no mixture-of-experts layers (a dense model)")
    return [f"mlp.experts.{name}" for name, _ in experts[0].named_parameters(recurse=False)]


class LoRABackend(PlainBackend):
    name = "lora"

    def __init__(self, model: torch.nn.Module, cfg: Config, need_reference: bool) -> None:
        from peft import LoraConfig, get_peft_model

        lc = cfg.train.lora
        apply_freeze(model, True, True, True)  # base weights frozen; only adapters (and opted-in parts) train
        peft_cfg = LoraConfig(
            r=lc.rank,
            lora_alpha=lc.alpha,
            lora_dropout=lc.dropout,
            target_modules=target_regex(lc.target_modules),
            target_parameters=expert_parameters(model) if lc.experts else None,
            bias="none",
        )
        peft_model = get_peft_model(model, peft_cfg)
        if not any(p.requires_grad for p in peft_model.parameters()):
            raise ValueError(f"train.lora.target_modules {lc.target_modules} matched no linear layer of the model")
        self._peft = peft_model
        self._need_reference = need_reference
        self.trainable_counts = {"lora": sum(p.numel() for p in peft_model.parameters() if p.requires_grad)}
        self._setup(peft_model, cfg, need_reference=False)  # no reference copy: the adapter is switched off
        for decoded in (peft_model, peft_model.get_base_model()):  # the engines hold one or the other
            register_decode_weights(decoded, self._merged_forwards)

    @contextmanager
    def reference(self):
        """Reference policy = the base model: the same module with the adapter disabled (no second copy)."""
        if not self._need_reference:
            yield None
            return
        with self._peft.disable_adapter():
            yield self._peft

    @contextmanager
    def _merged_forwards(self):
        """Each fp32 LoRA layer of the language model runs one product with W + scale * B @ A (a new tensor per
        layer, made at entry; the base is never written) instead of peft's three and its per-call Python, which more
        than halve a decode step's cost on the CPU (benchmarks/bench_vs_trl.py), and lets the decode fuse its
        projections (`text_decoder.fuse`). The fp32 sum differs from peft's path by rounding only (the log-probs
        within 1e-4, `tests/trainer/test_lora.py`); a 16-bit layer keeps peft's path, where the merged weight's one
        rounding to bf16 would move the sampling policy off the trainer's (the gap a vLLM engine's correction
        measures)."""
        layers = [m for n, m in self._merged_layers.items() if _mergeable(n, m)]
        try:
            with torch.no_grad():
                for m in layers:
                    bias = m.base_layer.bias
                    m.forward = functools.partial(
                        F.linear,
                        weight=m.base_layer.weight + _delta_weight(m),
                        bias=None if bias is None else bias.detach(),
                    )
            yield
        finally:
            for m in layers:
                m.__dict__.pop("forward", None)

    def vision_trainable(self) -> bool:
        return any(p.requires_grad and is_visual(n) for n, p in self._peft.named_parameters())

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Merged weights under the base model's names (for a rollout engine with its own copy, and export):
        W + scale * B @ A, summed in fp32 into a NEW tensor and rounded once to W's dtype, one layer at a time.

        The base is never written. peft's merge_adapter/unmerge_adapter round trip (W += dW; W -= dW) is not exact
        in bf16: repeated at every sync it moved the base, which is also the reference policy (adapter off) and the
        half of the export that is not the adapter, so a killed-and-resumed bf16 run left the run it should equal."""
        base, layers = self._peft.get_base_model().state_dict(), self._merged_layers
        for name, key in self._base_names.items():
            yield name, self._merged(key, base, layers)

    def sync_specs(self):
        """The merged layers and their siblings (an adapter on q_proj and v_proj sends k_proj too: vLLM fuses them),
        under the base model's names; the rest of the base never changes."""
        from vlgrpo.rollout.weight_stream import with_siblings

        base = self._peft.get_base_model()
        names, state = self._base_names, base.state_dict()
        changing = {base_name(n) for n in self._merged_layers}
        changing |= {base_name(n) for n, p in base.named_parameters() if p.requires_grad}
        changing -= {n for n in changing if "lora_" in n}
        return with_siblings(((n, state[k].dtype, tuple(state[k].shape)) for n, k in names.items()), changing)

    def sync_tensors(self, bucket):
        """As `named_weights` computes them (a merged layer is a new tensor), the bucket's names only."""
        base, layers, names = self._peft.get_base_model().state_dict(), self._merged_layers, self._base_names
        for name in bucket.names:
            yield self._merged(names[name], base, layers)

    @functools.cached_property
    def _base_names(self) -> dict[str, str]:
        """The base model's names (q_proj.weight) -> its state's under peft (q_proj.base_layer.weight), in order; fixed
        once peft has wrapped the model, so computed once, not per bucket."""
        state = self._peft.get_base_model().state_dict()
        return {base_name(n): n for n in state if "lora_" not in n}

    @functools.cached_property
    def _merged_layers(self) -> dict:
        """Base-model state name of each adapted weight ("...q_proj.base_layer.weight"; a MoE's fused experts,
        "...mlp.experts.base_layer.base_layer.gate_up_proj") -> its LoRA layer (a Linear, or peft's ParamWrapper)."""
        from peft.tuners.lora import LoraLayer, ParamWrapper

        base = self._peft.get_base_model()
        names = {id(p): n for n, p in base.named_parameters(remove_duplicate=False)}
        return {
            names[id(module.get_param() if isinstance(module, ParamWrapper) else module.base_layer.weight)]: module
            for module in base.modules()
            if isinstance(module, LoraLayer)
        }

    @staticmethod
    def _merged(key: str, base: dict, layers: dict) -> torch.Tensor:
        tensor, module = base[key], layers.get(key)
        if module is not None:
            tensor = (tensor.float() + _delta_weight(module)).to(tensor.dtype)
        return tensor.detach().clone()

    def adapter(self):
        """The adapter alone, in PEFT's saved form (fp32, on the CPU), for an engine that applies it itself."""
        from peft import get_peft_model_state_dict

        from vlgrpo.rollout.base import Adapter

        c = self._peft.peft_config["default"]
        config = {
            "peft_type": "LORA",
            "r": c.r,
            "lora_alpha": c.lora_alpha,
            "lora_dropout": 0.0,
            "target_modules": c.target_modules if isinstance(c.target_modules, str) else sorted(c.target_modules),
            "bias": "none",
            "fan_in_fan_out": c.fan_in_fan_out,
            "use_rslora": c.use_rslora,
            "use_dora": False,
            "modules_to_save": None,
            "task_type": None,
        }
        tensors = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(self._peft).items()}
        return Adapter(config, tensors)

    def state_dict(self) -> dict:
        from peft import get_peft_model_state_dict

        return {
            "adapter": get_peft_model_state_dict(self._peft),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            **self.master.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self._peft, state["adapter"])
        self.master.load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def export(self, out_dir: str | Path, processor) -> Path:
        """Merged plain HF checkpoint, exactly the weights the rollout engines get (`named_weights`: one rounding of
        the fp32 sum); the adapter alone is saved under `adapter/` too."""
        out = Path(out_dir)
        self._peft.save_pretrained(out / "adapter")
        merged = copy.deepcopy(self._peft).merge_and_unload()
        merged.load_state_dict(dict(self.named_weights()))
        merged.save_pretrained(out)
        processor.save_pretrained(out)
        return out


def _mergeable(name: str, layer) -> bool:
    """A language-model LoRA Linear over an fp32 nn.Linear, no adapter merged into it by peft, no DoRA: what
    `LoRABackend.rollout_weights` decodes merged."""
    from peft.tuners.lora import Linear

    base = getattr(layer, "base_layer", None)
    return (
        isinstance(layer, Linear)
        and type(base) is torch.nn.Linear
        and base.weight.dtype == torch.float32
        and not layer.merged
        and not layer.fan_in_fan_out
        and not any(layer.use_dora.get(a, False) for a in layer.active_adapters)
        and not is_visual(name)
    )


def _delta_weight(layer) -> torch.Tensor:
    """scale * B @ A of a LoRA layer's active adapters, in fp32 (peft's own product rounds to the adapter's dtype on
    a GPU). A layer kind other than Linear uses peft's product, widened."""
    from peft.tuners.lora import Linear

    delta = None
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        if isinstance(layer, Linear):
            d = layer.lora_B[adapter].weight.float() @ layer.lora_A[adapter].weight.float()
            d = (d.T if layer.fan_in_fan_out else d) * layer.scaling[adapter]
        else:
            d = layer.get_delta_weight(adapter).float()
        delta = d if delta is None else delta + d
    return delta if delta is not None else torch.zeros((), dtype=torch.float32)
