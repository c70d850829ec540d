"""Does vLLM's CPU build serve the tiny Qwen3-VL-MoE? Greedy tokens against the HF engine, in fp32 (the log: README.md).
Run: OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python dev/moe_vllm/run.py [arch] [expert width]"""

import sys
import tempfile
from pathlib import Path

import torch

from vlgrpo.data.adapters import load_samples
from vlgrpo.data.synth import synth_dataset
from vlgrpo.models import load_model
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.rollout.vllm.engine import VLLMEngine
from vlgrpo.tiny import TinySpec, init_tiny
from vlgrpo.vision_cache import VisionCache

arch = sys.argv[1] if len(sys.argv) > 1 else "qwen3_vl_moe"
dtype = "bfloat16" if arch == "qwen3_5_moe" else "float32"
work = Path(tempfile.mkdtemp())
synth_dataset(work / "data", 20, seed=0, image_size=112)
samples = load_samples(work / "data" / "train.jsonl").samples[:4]
width = int(sys.argv[2]) if len(sys.argv) > 2 else 96  # the experts' MLP width
lm = load_model(str(init_tiny(work / "tiny", arch, spec=TinySpec(moe_intermediate_size=width))))
gen = torch.Generator().manual_seed(1)
with torch.no_grad():
    for name, p in lm.model.named_parameters():
        if ".visual." not in f".{name}" and p.dim() >= 2:
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
lm.model.save_pretrained(work / "m")
lm.processor.save_pretrained(work / "m")
lm = load_model(str(work / "m"), dtype=dtype)
cache = VisionCache(lm.model.eval(), lm.processor)
engine = VLLMEngine.launch(
    str(work / "m"),
    lm.processor,
    cache,
    max_model_len=512,
    llm_kwargs={"dtype": dtype, "enforce_eager": True, "block_size": 32},
)
greedy = SamplingParams(completions_per_prompt=1, temperature=0, max_new_tokens=10)
want = [g.completions[0].token_ids for g in HFEngine(lm.model, lm.processor, cache).generate(samples, greedy)]
got = [g.completions[0].token_ids for g in engine.generate(samples, greedy)]
print("HF  ", want)
print("vLLM", got)
print("EQUAL" if got == want else "DIFFERENT")
