"""`vlgrpo demo`: the tiny end-to-end run on the shapes task, from nothing to a report, on a laptop CPU.

Orchestration only (it sits just under the CLI): every step calls the library. Grows with the pipeline.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


def run_demo(out_dir: str | Path, n_samples: int = 200, seed: int = 0, show: int = 4) -> dict:
    """Build the tiny model and the shapes data, load both back through the real loaders, sample answers."""
    from vlgrpo.data.adapters import load_samples
    from vlgrpo.data.images import load_image
    from vlgrpo.data.synth import synth_dataset
    from vlgrpo.models import count_parameters, init_tiny, load_model, placeholder_token_ids

    t0 = time.time()
    out = Path(out_dir)
    print(f"[1/3] building the tiny Qwen2.5-VL in {out / 'model'}")
    model_dir = init_tiny(out / "model", "qwen2_5_vl", seed=seed)
    print(f"[2/3] synthesising {n_samples} shapes samples in {out / 'data'}")
    paths = synth_dataset(out / "data", n_samples, seed=seed)
    lm = load_model(str(model_dir))
    test = load_samples(paths["test"]).samples[:show]
    print(f"[3/3] sampling answers of the untrained policy ({count_parameters(lm.model)['total']:,} parameters)")
    suppress = torch.tensor(placeholder_token_ids(lm.processor.tokenizer))
    rows = []
    for s in test:
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": s.question}]}]
        text = lm.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        inputs = lm.processor(text=[text], images=[load_image(s.image)], return_tensors="pt")
        ids = lm.model.generate(**inputs, max_new_tokens=16, do_sample=False, suppress_tokens=suppress)
        answer = lm.processor.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        rows.append({"id": s.id, "question": s.question, "gold": s.answer, "completion": answer})
        print(f"  {s.question!r:45} gold={s.answer!r:24} model={answer!r}")
    summary = {"samples": n_samples, "wall_seconds": round(time.time() - t0, 2), "examples": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"done in {summary['wall_seconds']} s -> {out / 'summary.json'}")
    return summary
