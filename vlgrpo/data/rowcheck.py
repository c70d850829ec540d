"""Why a row cannot be trained on, decided in one place for the trainer (which skips such a row when it draws it) and
`vlgrpo data doctor` (which reports it as an error): its image does not decode or resize, its text holds the chat
template's control tokens, its image_size or a box does not fit the image file.

Works on a Sample and its inspected image (`images.inspect_image`); knows nothing of models or tokenizers.
"""

from __future__ import annotations

from vlgrpo.data.images import ImageError, ImageInfo, ProcessorGeometry
from vlgrpo.data.prompts import VISION_PLACEHOLDERS, reserved_tokens
from vlgrpo.types import Sample

Problem = tuple[str, str]
"""(check, message), e.g. ("image_missing", "image file 'x.png' does not exist")."""


def text_problems(s: Sample) -> list[Problem]:
    """Reserved tokens in the question (a forged turn, extra image slots) or in the gold answer (which no completion
    can then state: decoding stops at the end of the turn and never samples a vision token)."""
    out = []
    in_question = reserved_tokens(s.question)
    vision = [t for t in in_question if t in VISION_PLACEHOLDERS]
    other = [t for t in in_question if t not in VISION_PLACEHOLDERS]
    if vision:
        out.append(("placeholder_literal", f"the question contains {', '.join(vision)}: vlgrpo inserts the image "
                    "placeholders itself, and a literal one breaks the image-token count; remove it"))  # fmt: skip
    if other:
        out.append(("template_token", f"the question contains {', '.join(other)}: the tokenizer reads them as the "
                    "chat template's control tokens, which would end the user turn inside the prompt (or forge "
                    "another turn); remove them"))  # fmt: skip
    in_answer = reserved_tokens(s.answer or "")
    if in_answer:
        out.append(("template_token", f"the answer contains {', '.join(in_answer)}: a completion stops at the end of "
                    "its turn and never samples a vision token, so no completion can state this answer; remove "
                    "them"))  # fmt: skip
    return out


def image_tokens(info: ImageInfo, geometry: ProcessorGeometry) -> int:
    """Image tokens of the decoded image, 0 when it cannot be used (unreadable, or refused by Qwen's resize)."""
    if info.problem is not None:
        return 0
    w, h = info.decoded
    try:
        return geometry.num_image_tokens(h, w)
    except ImageError:
        return 0


def image_problems(s: Sample, info: ImageInfo, geometry: ProcessorGeometry) -> list[Problem]:
    """The image itself, then what the row says about it: image_size and boxes against the real (decoded) size."""
    if info.problem is not None:
        return [info.problem]
    (w, h), (hw, hh) = info.decoded, info.header
    try:
        tokens = geometry.num_image_tokens(h, w)
    except ImageError as e:  # Qwen's resize refuses it (an aspect ratio above 200)
        return [("image_geometry", str(e))]
    out = []
    pads = tokens if (hw, hh) == (w, h) else geometry.num_image_tokens(hh, hw)  # the prompt's count: the header's
    if pads != tokens:
        out.append(("placeholder_count", f"the prompt would get {pads} <|image_pad|> tokens (header size {hw}x{hh}) "
                    f"but the decoded {w}x{h} image gives {tokens} features"))  # fmt: skip
    if s.image_size is not None and tuple(s.image_size) != (w, h):
        out.append(("image_size_mismatch", f"image_size {list(s.image_size)} but the image is {w}x{h} px; box "
                    "rewards scale by image_size, so every box would move: correct it or leave it out"))  # fmt: skip
    for box in s.boxes:
        x1, y1, x2, y2 = box
        if x1 < 0 or y1 < 0 or x2 > w or y2 > h:
            out.append(("box_out_of_image", f"box {box} lies outside the {w}x{h} image (boxes are original-image "
                        "pixels, [x1, y1, x2, y2])"))  # fmt: skip
    return out


def row_problems(s: Sample, info: ImageInfo, geometry: ProcessorGeometry) -> list[Problem]:
    """Every reason the row cannot be trained on; empty when it can."""
    return image_problems(s, info, geometry) + text_problems(s)
