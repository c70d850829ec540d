"""Tune the demo's sizes: build model + data, SFT, GRPO, each judged on the *val* split (never test).

    OMP_NUM_THREADS=1 python dev/tune_demo.py --out /tmp/t1 --set sft_steps=300 --spec hidden_size=128 \
        --stages sft,grpo --eval-every 50

Stages reuse what an earlier call left in --out (model/, data/, sft_model/), so several GRPO settings can be tried
from one SFT model (`--stages grpo --tag lr1e-4`). Prints the val VQA accuracy after each stage. `--extra` applies
raw dotted overrides to the stage config (e.g. model.freeze_merger=false); `--init-std` re-draws the language model's
weights (an experiment only: the demo uses the stock init).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from vlgrpo.demo.run import (
    DemoSettings,
    build_model_and_data,
    evaluate_model,
    from_scratch,
    resolve_base,
    stage_config,
)
from vlgrpo.tiny import TinySpec


def _parse(pairs: list[str], cls):
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    out = {}
    for pair in pairs:
        key, val = pair.split("=", 1)
        kind = str(types[key])
        out[key] = tuple(val.split(",")) if "tuple" in kind else float(val) if "float" in kind else int(val)
    return out


def _val_eval(model_dir: Path, cfg, val: Path, s: DemoSettings) -> dict:
    suites = ["vqa", "grounding"] if "ground" in s.kinds else ["vqa"]
    return evaluate_model(model_dir, cfg, val, s, suites).metrics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", nargs="*", default=[], help="DemoSettings key=value")
    ap.add_argument("--spec", nargs="*", default=[], help="TinySpec key=value")
    ap.add_argument("--stages", default="sft,grpo")
    ap.add_argument("--tag", default="", help="suffix of the grpo run directory")
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.0, help="re-draw the LM's weights with this std")
    ap.add_argument("--extra", nargs="*", default=[], help="raw config overrides for the stage(s) run")
    a = ap.parse_args()
    spec = dataclasses.replace(DemoSettings().spec, **_parse(a.spec, TinySpec))
    s = dataclasses.replace(from_scratch(), spec=spec, **_parse(a.set, DemoSettings))
    out = Path(a.out)
    from vlgrpo.evals.run import make_evaluator
    from vlgrpo.trainer import run_training
    from vlgrpo.trainer.export import export_run

    if not (out / "model" / "config.json").is_file():
        build_model_and_data(s, out, resolve_base(s.base))
        if a.init_std:
            _reinit_language(out / "model", a.init_std)
    results = {}
    for stage in a.stages.split(","):
        t0 = time.time()
        src = out / "model" if stage == "sft" else out / "sft_model"
        name = stage if stage == "sft" else f"grpo{a.tag}"
        cfg = stage_config(s, out, "sft" if stage == "sft" else "grpo", src)
        for pair in a.extra + [
            f"train.output_dir={out / name}",
            f"eval.every_steps={a.eval_every}",
            "eval.max_samples=150",
            "logging.progress_bar=false",
        ]:
            _set(cfg, pair)
        ev = make_evaluator(cfg) if a.eval_every else None
        history = run_training(cfg, evaluator=ev)
        export_run(out / name, out / f"{name}_model")
        for h in history:
            if any(k.startswith("eval/") for k in h):
                print(
                    f"  step {h['step']}: "
                    + " ".join(f"{k}={v:.3f}" for k, v in h.items() if k.startswith("eval/vqa/acc") and "task" not in k)
                )
        m = _val_eval(out / f"{name}_model", cfg, out / "data" / "val.jsonl", s)
        last = history[-10:]
        tail = {
            k: sum(h.get(k, 0.0) for h in last) / len(last)
            for k in ("loss", "grpo/entropy", "grpo/kl", "grpo/response_length", "reward/total")
            if k in last[-1]
        }
        results[name] = {"seconds": round(time.time() - t0, 1), "val": m, "tail": tail}
        print(
            f"== {name}: {time.time() - t0:.0f} s  val "
            + " ".join(f"{k}={v:.3f}" for k, v in m.items() if "task" not in k)
            + f"  tail {tail}",
            flush=True,
        )
    (out / f"tune{a.tag}.json").write_text(json.dumps(results, indent=2))


def _reinit_language(model_dir: Path, std: float) -> None:
    """Experiment: the language model's Linear/Embedding weights re-drawn from N(0, std) (vision untouched)."""
    import torch

    from vlgrpo.models import load_model

    lm = load_model(str(model_dir))
    torch.manual_seed(1)
    for name, mod in lm.model.named_modules():
        if ".visual" in f".{name}" or not isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
            continue
        torch.nn.init.normal_(mod.weight, 0.0, std)
    lm.model.save_pretrained(model_dir)


def _set(cfg, pair: str) -> None:
    """Apply one dotted key=value override to a resolved Config in place (YAML-typed value)."""
    import yaml

    key, val = pair.split("=", 1)
    *parents, leaf = key.split(".")
    obj = cfg
    for p in parents:
        obj = getattr(obj, p)
    if not hasattr(obj, leaf):
        raise KeyError(key)
    setattr(obj, leaf, yaml.safe_load(val))


if __name__ == "__main__":
    main()
