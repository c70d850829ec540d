"""A prompt's causal self-attention on the CPU in blocks of queries, each block against the keys up to its own end.

Given a mask (a padded batch of prompts), PyTorch's CPU flash kernel computes every query against every key, half of
them above the causal diagonal and masked away; with `is_causal` it skips little more. In blocks of BLOCK queries, the
work above the diagonal shrinks to one block's triangle per block: 2 prompts x 4 heads x 355 tokens, forward and
backward, 10.4 -> 7.4 ms; 1,100 tokens 95 -> 58 ms (dev/fast_path/README.md). Grouped-query heads go to the kernel as
they are (`enable_gqa`), where transformers repeats them whenever a mask is given (a limit of the CUDA kernels). The
result is the same attention, rounded apart by the kernel's other blocking (2e-7 in fp32).

`causal_blocks()` is entered around a prompt's pass (`policy.prefill`): transformers' attention modules look their
attention function up by name at call time, and inside it the name "sdpa" gives `blocked_sdpa`, which takes a causal
attention on the CPU of at least MIN_ROWS queries whose mask masks everything above the diagonal, and hands anything
else (the vision tower's windows, a decode step, a GPU, a mask that lets a query see later keys) to transformers' own
function unchanged.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

BLOCK = 96
"""Queries per block: 355 tokens in 4 blocks (7.3-7.8 ms against 8.1-8.3 in 2 and 7.4-7.7 in 8)."""
MIN_ROWS = 2 * BLOCK
"""Fewer queries run as one call (120 tokens: 1.3 ms either way)."""

_lock = threading.Lock()
_depth = 0
_restore: Callable | None = None
"""What "sdpa" named when the outermost `causal_blocks` was entered."""
_original: Callable | None = None
"""The function `blocked_sdpa` hands what it does not take to (transformers' sdpa attention)."""


@contextmanager
def causal_blocks() -> Iterator[None]:
    """Within: transformers' "sdpa" attention is `blocked_sdpa` (nested entries keep it; the last exit puts the
    function that was there back)."""
    global _depth, _restore, _original
    with _lock:
        if _depth == 0:
            _restore = _original = ALL_ATTENTION_FUNCTIONS["sdpa"]
            ALL_ATTENTION_FUNCTIONS["sdpa"] = blocked_sdpa
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                ALL_ATTENTION_FUNCTIONS["sdpa"] = _restore


def blocked_sdpa(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs):
    """transformers' sdpa attention function's signature and result ([B, q, heads, d], None): query [B, heads, q, d],
    key and value [B, kv heads, k, d] (k >= q: the last q positions are the queries'), attention_mask [B, 1, q, k]
    (True or 0 where a query may attend) or None."""
    original = _original
    if not _takes(module, query, key, attention_mask, kwargs):
        return original(module, query, key, value, attention_mask, **kwargs)
    b, heads, q_len, d = query.shape
    k_len = key.shape[2]
    offset = k_len - q_len  # query i sits at position offset + i
    if attention_mask is None:  # causal alone
        attention_mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(offset)[None, None]
    elif _sees_later_keys(attention_mask, offset):
        return original(module, query, key, value, attention_mask, **kwargs)
    n = math.ceil(q_len / BLOCK)
    edges = [round(q_len * i / n) for i in range(n + 1)]
    gqa = key.shape[1] != heads
    out = torch.cat(
        [
            F.scaled_dot_product_attention(
                query[:, :, start:end],
                key[:, :, : offset + end],
                value[:, :, : offset + end],
                attn_mask=attention_mask[:, :, start:end, : offset + end],
                scale=kwargs.get("scaling"),
                enable_gqa=gqa,
            )
            for start, end in zip(edges[:-1], edges[1:])
        ],
        dim=2,
    )
    return out.transpose(1, 2).contiguous(), None


def _takes(module, query: Tensor, key: Tensor, mask: Tensor | None, kwargs: dict) -> bool:
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    return (
        bool(causal)
        and query.device.type == "cpu"
        and query.shape[2] >= MIN_ROWS
        and key.shape[2] >= query.shape[2]
        and query.shape[1] % key.shape[1] == 0
        and not kwargs.get("dropout")
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None
        and not kwargs.get("output_attentions")
        and (mask is None and key.shape[2] == query.shape[2] or mask is not None and mask.dim() == 4)
    )


_checked: tuple | None = None
"""The last mask `_sees_later_keys` looked at (a weak reference, its version and the offset) and its answer:
transformers builds one mask per forward and hands it to every layer."""


def _sees_later_keys(mask: Tensor, offset: int) -> bool:
    """Whether the mask lets some query attend to a key after its own position (above the causal diagonal), which
    the blocks would drop. Looked at once per mask (0.8 ms for 2 x 355 x 355, what a block call saves)."""
    global _checked
    if _checked is not None and _checked[0]() is mask and _checked[1:3] == (mask._version, offset):
        return _checked[3]
    answer = _above_diagonal(mask, offset)
    _checked = (weakref.ref(mask), mask._version, offset, answer)
    return answer


def _above_diagonal(mask: Tensor, offset: int) -> bool:
    q_len, k_len = mask.shape[-2:]
    later = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).triu(offset + 1)
    above = mask[..., later]
    if mask.dtype == torch.bool:
        return bool(above.any())
    return bool((above > torch.finfo(mask.dtype).min / 2).any())
