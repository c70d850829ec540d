"""What vLLM's in-place weight reload receives: the checkpoint name of each HF/peft/DeepSpeed parameter, the pairs one
sync pushes (a frozen tower left out), and the worker-side refresh of a tied LM head after a reload. No vllm import:
the functions run on names, tensors and the worker objects vLLM hands them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from torch import Tensor

from vlgrpo import heartbeat
from vlgrpo.models import is_visual

_WRAPPER_PREFIXES = ("module.", "base_model.model.", "_orig_mod.")
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "base_layer.", "modules_to_save.default.")


def vllm_param_name(name: str) -> str | None:
    """HF/peft/DeepSpeed parameter name -> the checkpoint name vLLM's `load_weights` accepts; None = do not push.

    LoRA factors (`lora_A/B`, `lora_embedding_*`) and peft's `original_module` copies are skipped: a merged LoRA
    weight comes under its `base_layer` name, which maps to the plain checkpoint name.
    """
    if "lora_" in name or ".original_module." in name:
        return None
    for prefix in _WRAPPER_PREFIXES:
        while name.startswith(prefix):
            name = name[len(prefix) :]
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def checkpoint_weights(named_params: Iterable[tuple[str, Tensor]], push_visual: bool, pushed: dict) -> Iterator:
    """(checkpoint name, tensor) pairs for vLLM's reload, counting into `pushed` (`params`, `visual`)."""
    for name, tensor in named_params:
        vname = vllm_param_name(name)
        if vname is None or (is_visual(vname) and not push_visual):
            continue
        pushed["params"] += 1
        pushed["visual"] = pushed["visual"] or is_visual(vname)
        heartbeat.beat("weight sync to vLLM")
        yield vname, tensor


def _refresh_tied_lm_head(worker) -> int:
    """Worker-side (through `collective_rpc`): re-run the LM head's post-load step after a reload.

    With tied embeddings vLLM's loader skips `lm_head.weight` (it is the embedding), but on the CPU backend the LM
    head keeps a packed copy of the weight made after loading, which the in-place reload leaves stale (measured:
    1.7e-2 log-prob error). Re-processing the head repacks it from the (reloaded) shared weight; on GPUs the head
    reads the shared weight directly and this is a cheap no-op. Returns how many heads were refreshed."""
    refreshed = 0
    for name, module in worker.get_model().named_modules():
        method = getattr(module, "quant_method", None)
        if name.endswith("lm_head") and method is not None and hasattr(module, "weight"):
            method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed
