"""Values of `vlgrpo plan`'s flags that are not plain numbers: image and video frame sizes, the offload list."""

from __future__ import annotations

from vlgrpo.memory.inputs import OFFLOAD_TARGETS
from vlgrpo.memory.specs import PlanError


def parse_image_size(text: str, flag: str = "--image-size") -> tuple[int, int]:
    """`WxH` -> (W, H), e.g. 448x448 (`flag` names the option in errors)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise PlanError(f"{flag} {text!r} must look like WIDTHxHEIGHT, e.g. 448x448") from None
    if w < 1 or h < 1:
        raise PlanError(f"{flag} {text!r}: width and height must be >= 1")
    return w, h


def parse_offload(text: str) -> frozenset[str]:
    """`optimizer,param` -> the offload set ('none' clears it)."""
    items = {x.strip() for x in text.split(",") if x.strip() and x.strip() != "none"}
    items = {"param" if x == "params" else x for x in items}
    bad = sorted(items - set(OFFLOAD_TARGETS))
    if bad:
        raise PlanError(f"--offload {bad}: accepted: {', '.join(OFFLOAD_TARGETS)} or none (comma-separated)")
    return frozenset(items)
