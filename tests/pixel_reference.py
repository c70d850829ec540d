"""The transformers model's own forward on pixels over a whole token sequence with several images (the reference the
multi-turn tests compare vlgrpo's cached-feature passes with)."""

from __future__ import annotations

import torch


def pixel_logits(model, processor, ids: list[int], images: list) -> torch.Tensor:
    """Logits [T, V] of `ids` (one row, its <|image_pad|> runs already expanded) with `images` (PIL, in the order of
    their runs) processed by the checkpoint's image processor and encoded by the model itself."""
    row = torch.tensor([ids])
    pixels = processor.image_processor(images=images, return_tensors="pt")
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    with torch.no_grad():
        return model(
            input_ids=row,
            pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"],
            mm_token_type_ids=(row == image_id).long(),
        ).logits[0]
