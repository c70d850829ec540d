"""Shared fixtures: the tiny Qwen-VL checkpoints and a small shapes dataset, built once per test session."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# The vLLM tests run in vLLM's own environment (`make test-vllm`); elsewhere they are not even collected.
VLLM_TESTS = ["rollout/test_vllm_engine.py", "trainer/test_vllm_train.py", "evals/test_vllm_eval.py"]
collect_ignore = [] if importlib.util.find_spec("vllm") else VLLM_TESTS


def spread_language_weights(model, scale: float, seed: int = 1) -> None:
    """Add seeded noise (std `scale`) to the 2-D language-model weights in place: a random tiny model decodes one
    repeated token, a spread one varied sequences, which makes "the same greedy tokens" a check that can fail."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".visual." not in f".{name}" and p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale)


def spread_deepstack_mergers(model, scale: float, seed: int = 7) -> int:
    """Add seeded noise (std `scale`) to the 2-D weights of Qwen3-VL's DeepStack mergers in place; how many were
    spread (0 for a tower without DeepStack). At init their maps are too small beside a spread language model's hidden
    states to change a token; spread by 1.0, greedy tokens depend on them, so a path that drops them can fail a test."""
    gen, spread = torch.Generator().manual_seed(seed), 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".deepstack_merger_list." in name and p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale)
                spread += 1
    return spread


@pytest.fixture(scope="session")
def spread():
    """`spread_language_weights` (tests in any folder can use it as a fixture)."""
    return spread_language_weights


@pytest.fixture(scope="session")
def spread_deepstack():
    """`spread_deepstack_mergers`, as a fixture."""
    return spread_deepstack_mergers


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory: arch -> directory of a saved tiny checkpoint (built once per arch per session)."""
    from vlgrpo.tiny import init_tiny

    built: dict[str, str] = {}

    def get(arch: str = "qwen2_5_vl") -> str:
        if arch not in built:
            built[arch] = str(init_tiny(tmp_path_factory.mktemp(f"tiny_{arch}"), arch, seed=0))
        return built[arch]

    return get


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory):
    """A 40-sample shapes dataset (train 32 / val 4 / test 4) at 112 px."""
    from vlgrpo.data.synth import synth_dataset

    out = tmp_path_factory.mktemp("shapes")
    synth_dataset(out, 40, seed=0, image_size=112)
    return out


@pytest.fixture(scope="module")
def load(tiny_model_dir, spread):
    """arch -> a freshly loaded tiny model and its processor (one per arch per module), its LM weights spread out
    (seeded) so that greedy decoding varies.

    The random init decodes one repeated token; scaled-up weights give varied sequences, which makes
    "same greedy tokens" a test that can fail.
    """
    from vlgrpo.models import load_model

    def get(arch: str = "qwen2_5_vl", spread_by: float = 0.0, **kw):
        lm = load_model(tiny_model_dir(arch), **kw)
        if spread_by:
            spread(lm.model, spread_by)
        return lm.model.eval(), lm.processor

    return get


@pytest.fixture(scope="module")
def samples(shapes_dir):
    """The shapes dataset's train samples."""
    from vlgrpo.data.adapters import load_samples

    return load_samples(shapes_dir / "train.jsonl").samples


@pytest.fixture(scope="session")
def tool_caller_dir(tmp_path_factory, tiny_model_dir, shapes_dir):
    """The tiny Qwen2.5-VL taught to zoom into [0, 0, 56, 56] on the first shapes sample's tool prompt
    (`tool_model.teach_tool_call`), saved: its greedy trajectories call the tool and get the crop back."""
    from tool_model import teach_tool_call

    from vlgrpo.data.adapters import load_samples
    from vlgrpo.models import load_model

    lm = load_model(tiny_model_dir("qwen2_5_vl"))
    first = load_samples(shapes_dir / "train.jsonl").samples[:1]
    losses = teach_tool_call(lm.model, lm.processor, first, steps=90, lr=1.5e-3)
    assert losses[-1] < 0.1, losses[-10:]
    out = tmp_path_factory.mktemp("tool_caller")
    lm.model.save_pretrained(out)
    lm.processor.save_pretrained(out)
    return str(out)
