"""How a decode sees the policy's weights. A training backend may register, per model, a context in which the model's
layers run a faster form of the same weights for decoding: the LoRA backend's runs each fp32 adapter merged into its
layer's weight (`trainer.lora.LoRABackend`). Every HF decode of the model (the rollout's, the in-loop eval's) enters
it around its decode loop and nowhere else: a prompt prefill kept for the update (`policy.kept_prefill`) runs the
trainable path, so its graph reaches the adapters.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from weakref import WeakKeyDictionary

_CONTEXTS: WeakKeyDictionary = WeakKeyDictionary()


def register_decode_weights(model, context: Callable[[], AbstractContextManager]) -> None:
    """`context()` is entered around each decode loop of `model`."""
    _CONTEXTS[model] = context


def decode_weights(model) -> AbstractContextManager:
    """The context `model`'s decode loop runs in (nothing registered: no change)."""
    return _CONTEXTS.get(model, nullcontext)()
