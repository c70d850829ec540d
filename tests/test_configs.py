"""Every shipped config: loads and validates, holds only non-default keys, the 8xA100 recipes fit A100-80GB by
`vlgrpo plan`, the DeepSpeed JSON agrees with the configs that use it, the tiny recipes train, the launch scripts
build the right commands, and docs/configuration.md is what the generator writes."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vlgrpo.cli import main
from vlgrpo.config import Config, get_key, load_config
from vlgrpo.families import FAMILIES, family

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
NODE_8XA100 = [p for p in CONFIGS if "8xa100" in p.name]
DS_JSON = ROOT / "configs" / "ds_zero3_bf16.json"


def _leaves(tree: dict, prefix: str = ""):
    for k, v in tree.items():
        if isinstance(v, dict) and k != "recipe":
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_the_shipped_recipes_are_all_there():
    names = {p.name for p in CONFIGS}
    assert {
        "qwen2_5_vl_7b_lora_8xa100.yaml",
        "qwen2_5_vl_7b_zero3_8xa100.yaml",
        "qwen2_vl_2b_lora_1gpu.yaml",
        "qwen3_vl_8b_lora_8xa100.yaml",
        "qwen3_vl_8b_zero3_8xa100.yaml",
        "qwen3_vl_30b_a3b_lora_8xa100.yaml",
        "qwen3_5_35b_a3b_lora_8xa100.yaml",
        "qwen3_5_9b_lora_8xa100.yaml",
        "qwen3_5_9b_zero3_8xa100.yaml",
        "qwen2_5_vl_7b_deepeyes_8xa100.yaml",
        "tiny_grpo.yaml",
        "tiny_sft.yaml",
    } <= names
    assert len(NODE_8XA100) == 9


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_validates_and_holds_only_what_differs_from_the_defaults(path):
    cfg = load_config(path)
    defaults = Config()
    same = [k for k in _leaves(yaml.safe_load(path.read_text())) if get_key(cfg, k) == get_key(defaults, k)]
    assert same == [], f"{path.name} repeats default values: {same}"
    if cfg.model.name_or_path.startswith("Qwen/"):  # the real recipes: the stated hardware assumptions hold
        m, r = cfg.model, cfg.rollout
        assert m.dtype == "bfloat16" and m.max_pixels and m.arch in FAMILIES
        assert m.freeze_vision and m.freeze_merger and r.vision_cache_dir and r.placement == "colocate"
        # vLLM, asleep during the update; a MoE recipe decodes with the trainer's model (HF: routing replay)
        moe = family(m.arch).dense is not None
        assert (r.engine == "hf" and cfg.train.routing_replay == "rollout") if moe else r.engine == "vllm"
        assert r.vllm.enable_sleep_mode
        token_px = 32 if family(m.arch).qwen3 else 28  # a token covers 2 x 2 patches of 16 or 14 px
        assert m.max_pixels % token_px**2 == 0
        assert m.max_pixels // token_px**2 + 64 <= cfg.data.max_prompt_length  # the largest image + a question fits


@pytest.mark.parametrize("path", NODE_8XA100, ids=lambda p: p.name)
def test_8xa100_recipes_fit_a100_80gb(path, capsys):
    cfg = load_config(path)
    assert cfg.train.num_gpus == 8 and cfg.rollout.completions_per_prompt == 8
    # the default 448x448 image, then the worst case: any large image is capped at model.max_pixels (484 tokens)
    for extra in ([], ["--image-size", "4000x4000", "--text-tokens", "128"]):
        assert main(["plan", str(path), "--json", *extra]) == 0
        report = json.loads(capsys.readouterr().out)
        verdict = report["verdicts"]["A100-80GB"]
        assert verdict["fits"] and verdict["warnings"] == [] and report["suggestions"] == []
        assert verdict["headroom_bytes"] > 5e9, "keep >= 5 GB: the plan leaves out allocator and NCCL temporaries"
        assert report["inputs"]["num_gpus"] == 8 and report["counts"]["train_gpus"] == 8
    # 4000 px scaled into 401408 px: 616 x 616 -> 22 x 22 tokens of 28 px; into Qwen3-VL's 524288 px: 704 x 704 ->
    # 22 x 22 tokens of 32 px
    assert report["inputs"]["image_tokens"] == 484


# `vlgrpo plan` of the Qwen3-VL-8B recipes (docs/train-qwen3-vl-8b.md quotes these rows): both peak in the rollout,
# where vLLM holds its 0.35 or 0.4 x 85.90 GB next to the trainer's resident memory
QWEN3_VERDICTS = {
    "qwen3_vl_8b_lora_8xa100.yaml": "A100-80GB        85.90     54.01     31.88  fits: rollout peak 54.01 GB <= 85.90 GB capacity",  # noqa: E501
    "qwen3_vl_8b_zero3_8xa100.yaml": "A100-80GB        85.90     56.36     29.54  fits: rollout peak 56.36 GB <= 85.90 GB capacity",  # noqa: E501
}


# `vlgrpo plan` of the Qwen3.5-9B recipes (docs/train-qwen3_5-9b.md quotes these rows): 1024-token completions; the
# rollout term holds the 8 attention layers' KV and a fixed Gated DeltaNet state per sequence
QWEN3_5_VERDICTS = {
    "qwen3_5_9b_lora_8xa100.yaml": "A100-80GB        85.90     55.26     30.64  fits: rollout peak 55.26 GB <= 85.90 GB capacity",  # noqa: E501
    "qwen3_5_9b_zero3_8xa100.yaml": "A100-80GB        85.90     55.24     30.66  fits: rollout peak 55.24 GB <= 85.90 GB capacity",  # noqa: E501
}


# recipe -> (the model line's start, the tokens line, the A100-80GB row)
RECIPE_PLANS = {
    **{n: ("Qwen/Qwen3-VL-8B-Instruct", "64 text + 196 image + 512 completion", v) for n, v in QWEN3_VERDICTS.items()},
    **{n: ("Qwen/Qwen3.5-9B", "64 text + 196 image + 1024 completion", v) for n, v in QWEN3_5_VERDICTS.items()},
}


@pytest.mark.parametrize("name", sorted(RECIPE_PLANS))
def test_qwen3_vl_8b_and_qwen3_5_9b_recipes_verdict_on_a100_80gb(name, capsys):
    model, tokens, verdict = RECIPE_PLANS[name]
    assert main(["plan", str(ROOT / "configs" / name)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"model: {model}  (")
    assert f"tokens: {tokens}" in out  # 448 px: 14 x 14 tokens of 32 px
    row = next(line for line in out.splitlines() if line.startswith("A100-80GB"))
    assert row == verdict


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name.startswith("qwen")], ids=lambda p: p.name)
def test_real_model_recipes_are_clean_under_the_doctor(path, shapes_dir, capsys):
    """`vlgrpo data doctor RECIPE` with the recipe's own geometry (no checkpoint here: the released processor of its
    arch), prompt lengths and reward, on the shapes task standing in for the user's data."""
    splits = [f"data.{s}={shapes_dir / f'{s}.jsonl'}" for s in ("train", "val", "test")]
    assert main(["data", "doctor", str(path), "--no-progress", *(a for s in splits for a in ("--set", s))]) == 0
    out = capsys.readouterr().out
    assert "0 error(s), 0 warning(s): ready" in out
    qwen3 = family(load_config(path).model.arch).qwen3  # Qwen3-VL, Qwen3.5 and their MoE siblings
    assert ("geometry: patch 16, merge 2, pixels 65536.." if qwen3 else "geometry: patch 14, merge 2") in out


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name.startswith("qwen")], ids=lambda p: p.name)
def test_user_data_recipes_evaluate_only_what_any_verifiable_data_supports(path):
    """A converted LLaVA / R1-V file has neither boxes nor objects: grounding and POPE stay a commented opt-in, or
    `vlgrpo train` would refuse the recipe on such data."""
    cfg = load_config(path)
    assert cfg.eval.every_steps == 50 and cfg.eval.suites == ["vqa"]
    text = path.read_text()
    assert "# suites: [vqa, grounding, pope]" in text and "answer_type box" in text and "distinct" in text
    assert "vlgrpo/config.py" not in text and "grpo/clip_fraction" not in text  # a file and a metric that do not exist


def test_deepspeed_json_is_zero3_bf16_and_agrees_with_the_configs_using_it():
    ds = json.loads(DS_JSON.read_text())
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and ds["bf16"] == {"enabled": True} and ds["zero_allow_untested_optimizer"] is True
    assert not {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"} & set(ds)
    assert zero["reduce_bucket_size"] == 3584**2  # Qwen2.5-VL-7B hidden size squared (HF's "auto" rule)
    users = [p for p in CONFIGS if load_config(p).train.zero3.deepspeed_config]
    assert users and all(load_config(p).train.backend == "zero3" for p in users)
    from vlgrpo.trainer.zero3 import ds_config

    for path in users:
        cfg = load_config(path)
        assert (ROOT / cfg.train.zero3.deepspeed_config).resolve() == DS_JSON
        assert cfg.model.dtype == "bfloat16" and ds["gradient_clipping"] == cfg.train.max_grad_norm
        # the JSON wins over train.zero3.offload_*: the two must say the same, or `vlgrpo plan` plans another run
        assert ("offload_optimizer" in zero) == cfg.train.zero3.offload_optimizer
        assert ("offload_param" in zero) == cfg.train.zero3.offload_param
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            built = ds_config(cfg, world_size=8)
        finally:
            os.chdir(cwd)
        # 4 prompts x G 8 = 32 completions per GPU in micro-batches of 8 -> 4 accumulation steps; x 8 GPUs
        assert (built["train_micro_batch_size_per_gpu"], built["gradient_accumulation_steps"]) == (8, 4)
        assert built["train_batch_size"] == 256 and built["zero_optimization"] == zero


@pytest.mark.parametrize("name,metric", [("tiny_sft.yaml", "train/loss"), ("tiny_grpo.yaml", "reward/total")])
def test_tiny_recipe_trains_with_in_loop_eval(name, metric, tiny_model_dir, shapes_dir, tmp_path):
    from vlgrpo.trainer.metrics import read_metrics

    overrides = [
        f"model.name_or_path={tiny_model_dir()}",
        f"data.train={shapes_dir / 'train.jsonl'}",
        f"data.val={shapes_dir / 'val.jsonl'}",
        f"data.test={shapes_dir / 'test.jsonl'}",
        "train.steps=1",
        f"train.output_dir={tmp_path / 'run'}",
        "logging.progress_bar=false",
        "eval.every_steps=1",
        "eval.max_samples=2",
    ]
    assert main(["train", str(ROOT / "configs" / name), *overrides]) == 0
    (row,) = read_metrics(tmp_path / "run")
    assert row["step"] == 1 and metric in row and "eval/vqa/accuracy" in row
    assert (tmp_path / "run" / "checkpoints" / "step_1" / "meta.json").is_file()


def _script(name: str, *args: str, **env: str) -> tuple[int, str]:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, **env},
        timeout=120,
    )
    return proc.returncode, proc.stderr


def test_train_sh_runs_doctor_then_torchrun_with_the_config_gpu_count():
    rc, err = _script("train.sh", "configs/qwen2_5_vl_7b_zero3_8xa100.yaml", "train.lr=2e-6")
    py = sys.executable
    assert rc == 0 and err.splitlines() == [
        f"+ {py} -m vlgrpo.cli data doctor configs/qwen2_5_vl_7b_zero3_8xa100.yaml --set train.lr=2e-6",
        f"+ {py} -m torch.distributed.run --standalone --nproc_per_node 8 --max-restarts 3 -m vlgrpo.cli train "
        "configs/qwen2_5_vl_7b_zero3_8xa100.yaml train.lr=2e-6",
    ]
    rc, err = _script("train.sh", "configs/qwen2_5_vl_7b_zero3_8xa100.yaml", SKIP_DOCTOR="1", MAX_RESTARTS="0")
    assert rc == 0 and "--max-restarts 0 " in err
    split = ("rollout.placement=split", "rollout.vllm.rollout_gpus=4")  # the recipe's dynamic sampling included
    rc, err = _script("train.sh", "configs/qwen2_5_vl_7b_zero3_8xa100.yaml", *split, SKIP_DOCTOR="1")
    assert rc == 0 and "--nproc_per_node 4 " in err  # 4 + 4: the other 4 GPUs run the ranks' vLLM workers
    rc, err = _script("train.sh", "configs/qwen2_vl_2b_lora_1gpu.yaml", SKIP_DOCTOR="1")
    assert rc == 0 and err.splitlines() == [f"+ {py} -m vlgrpo.cli train configs/qwen2_vl_2b_lora_1gpu.yaml"]
    rc, err = _script("train.sh", "configs/tiny_grpo.yaml", "train.lrr=1")
    assert rc == 1 and "unknown config key 'train.lrr'" in err and "+ " not in err  # nothing launched


def test_train_multinode_sh_torchrun_and_hostfile(tmp_path):
    """torchrun nodes meet in the c10d rendezvous, so a restart is one attempt agreed by every node (the static one
    let each node count its own restarts); the deepspeed launcher reads a hostfile."""
    rc, err = _script(
        "train_multinode.sh",
        "configs/qwen2_5_vl_7b_zero3_8xa100.yaml",
        NNODES="2",
        MASTER_ADDR="10.0.0.1",
        SKIP_DOCTOR="1",
    )
    assert rc == 0 and err.splitlines() == [
        f"+ {sys.executable} -m torch.distributed.run --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d "
        "--rdzv-endpoint 10.0.0.1:29500 --rdzv-id vlgrpo --max-restarts 3 -m vlgrpo.cli train "
        "configs/qwen2_5_vl_7b_zero3_8xa100.yaml train.num_gpus=16"
    ]
    hosts = tmp_path / "hostfile"
    hosts.write_text("# two nodes\nnode-a slots=8\nnode-b slots=4\n")
    rc, err = _script(
        "train_multinode.sh",
        "configs/qwen2_5_vl_7b_zero3_8xa100.yaml",
        "train.lr=2e-6",
        HOSTFILE=str(hosts),
        SKIP_DOCTOR="1",
    )
    assert rc == 0 and err.splitlines() == [
        f"+ deepspeed --hostfile {hosts} --master_addr node-a --master_port 29500 --no_local_rank --module vlgrpo.cli "
        "train configs/qwen2_5_vl_7b_zero3_8xa100.yaml train.num_gpus=12 train.lr=2e-6"
    ]
    rc, err = _script("train_multinode.sh", "configs/tiny_grpo.yaml")
    assert rc != 0 and "set NNODES and MASTER_ADDR" in err


def test_train_multinode_sh_starts_the_training_ranks_of_a_split_vllm_rollout(tmp_path):
    """4 + 4 on each of 2 nodes: 4 training processes per node (each rank's vLLM worker takes one of the other 4
    GPUs), the config recording all 16 GPUs; the deepspeed launcher would start a rank on every slot."""
    split = ("rollout.placement=split", "rollout.engine=vllm", "rollout.vllm.rollout_gpus=4")
    rc, err = _script(
        "train_multinode.sh",
        "configs/qwen2_5_vl_7b_zero3_8xa100.yaml",
        *split,
        NNODES="2",
        MASTER_ADDR="10.0.0.1",
        SKIP_DOCTOR="1",
    )
    assert rc == 0 and err.splitlines() == [
        f"+ {sys.executable} -m torch.distributed.run --nnodes 2 --nproc_per_node 4 --rdzv-backend c10d "
        "--rdzv-endpoint 10.0.0.1:29500 --rdzv-id vlgrpo --max-restarts 3 -m vlgrpo.cli train "
        "configs/qwen2_5_vl_7b_zero3_8xa100.yaml train.num_gpus=16 " + " ".join(split)
    ]
    hosts = tmp_path / "hostfile"
    hosts.write_text("node-a slots=8\nnode-b slots=8\n")
    rc, err = _script(
        "train_multinode.sh", "configs/qwen2_5_vl_7b_zero3_8xa100.yaml", *split, HOSTFILE=str(hosts), SKIP_DOCTOR="1"
    )
    assert rc == 2 and "runs under torchrun" in err and "+ " not in err
    rc, err = _script("train_multinode.sh", "configs/tiny_grpo.yaml", "train.lrr=1", NNODES="2", MASTER_ADDR="10.0.0.1")
    assert rc == 1 and "unknown config key 'train.lrr'" in err and "+ " not in err  # nothing launched


def test_eval_sh_evaluates_the_newest_checkpoint_with_the_runs_settings(tmp_path):
    """The run's suites and completion budget (512 in the recipe; the CLI's own default is 128, which cut reasoning
    off), as its in-loop eval decodes."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_50").mkdir(parents=True)
    (run / "checkpoints" / "step_100").mkdir()
    cfg = load_config(ROOT / "configs" / "qwen2_5_vl_7b_zero3_8xa100.yaml", ["eval.suites=[vqa,pope]"])
    (run / "config.yaml").write_text(yaml.safe_dump(__import__("dataclasses").asdict(cfg)))
    rc, err = _script("eval.sh", str(run), "--max-samples", "50")
    py = sys.executable
    assert rc == 0 and err.splitlines() == [
        f"+ {py} -m vlgrpo.cli eval --model {run} --suite vqa,pope --out {run}/eval/step_100 --dtype bfloat16 "
        "--max-new-tokens 512 --data data/my_task/test.jsonl --answer-format think_answer --max-samples 50",
    ]


def test_configuration_reference_is_generated_and_current():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.render()
    assert (ROOT / "docs" / "configuration.md").read_text() == text, "run: python scripts/gen_config_docs.py"
    for f in ("model.max_pixels", "rollout.placement", "train.zero3.deepspeed_config", "reward.overlong.enabled"):
        assert f"| `{f}` |" in text
    row = "| `grpo.aggregation` | str | `token-mean` | token-mean, seq-mean-token-mean, seq-mean-token-sum-norm |"
    assert row in text


def _doc_block(doc: str, first_line: str) -> str:
    """The fenced code block of docs/<doc> whose first line is `first_line`."""
    text = (ROOT / "docs" / doc).read_text()
    start = re.search(r"\n```\w*\n" + re.escape(first_line) + "\n", text).end() - len(first_line) - 1
    return text[start : text.index("\n```", start)]


def test_adapt_guide_worked_example_converts_checks_and_scores(tmp_path, monkeypatch):
    """The RefCOCO conversion, config and reward function of docs/adapt-your-dataset.md run as written."""
    (tmp_path / "data" / "refcoco_flat").mkdir(parents=True)
    (tmp_path / "data" / "coco" / "train2014").mkdir(parents=True)
    refs = [
        {
            "ref_id": 7,
            "image": "a.jpg",
            "width": 640,
            "height": 427,
            "split": "val",
            "category": "person",
            "bbox": [103.9, 152.6, 158.5, 218.1],
            "sentences": ["lady in the blue shirt", "woman on the left"],
        },
        {
            "ref_id": 8,
            "image": "a.jpg",
            "width": 640,
            "height": 427,
            "split": "train",
            "category": "dog",
            "bbox": [400, 200, 100, 80],
            "sentences": ["brown dog"],
        },
    ]
    (tmp_path / "data" / "refcoco_flat" / "refs.json").write_text(json.dumps(refs))
    from PIL import Image

    Image.new("RGB", (640, 427), (90, 120, 40)).save(tmp_path / "data" / "coco" / "train2014" / "a.jpg")
    monkeypatch.chdir(tmp_path)
    exec(
        _doc_block("adapt-your-dataset.md", "# convert_refs.py: RefCOCO-style refs -> vlgrpo JSONL, one file per split")
    )
    (val, *_) = [json.loads(line) for line in open("data/refcoco_rec/val.jsonl")]
    assert val["boxes"] == [[103.9, 152.6, 103.9 + 158.5, 152.6 + 218.1]] and val["image_size"] == [640, 427]
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "my_refcoco.yaml").write_text(
        _doc_block("adapt-your-dataset.md", "# configs/my_refcoco.yaml: the 7B LoRA recipe on RefCOCO")
    )
    from vlgrpo.preflight import diagnose

    report = diagnose("configs/my_refcoco.yaml")
    assert report.errors == 0 and report.warnings == 0
    assert {n: (st.samples, max(st.image_tokens)) for n, st in report.splits.items()} == {
        "train": (1, 345),
        "val": (2, 345),
    }

    (tmp_path / "my_rewards.py").write_text(_doc_block("adapt-your-dataset.md", "# my_rewards.py"))
    from vlgrpo.rewards import RewardContext, check_recipe, score
    from vlgrpo.types import Sample

    recipe = yaml.safe_load(_doc_block("adapt-your-dataset.md", "reward:"))["reward"]["recipe"]
    check_recipe(recipe)
    sample = Sample("s", "How many?", "2", "number", objects=["red circle", "blue square"])
    batch = score(["<think>one red circle</think><answer>2</answer>"], [sample], recipe, RewardContext())
    assert batch.components["my_rewards.py:names_the_objects"] == [0.5] and batch.total == [1.0 + 0.2 + 0.05]


GUIDES = ["adapt-your-dataset.md", "train-qwen2_5-vl-7b.md", "train-qwen3-vl-8b.md", "scaling-out.md"]


@pytest.mark.parametrize("doc", GUIDES)
def test_guides_name_only_real_config_keys_and_cli_flags(doc):
    import re
    import shlex

    from vlgrpo.cli.main import build_parser

    text = (ROOT / "docs" / doc).read_text()
    section = r"(?<![\w./-])((?:model|data|rollout|reward|grpo|train|eval|logging)\.[a-z_][a-z0-9_.]*[a-z0-9_])"
    keys = set(re.findall(section, text))  # dotted config keys, not module paths (vlgrpo.data.x) or file names
    keys = {k for k in keys if not k.endswith((".yaml", ".py", ".json", ".jsonl", ".md"))}
    assert len(keys) > 5
    for key in sorted(keys):
        get_key(Config(), key)  # AttributeError names a key the docs invent
    commands = 0
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].split(" > ")[0].strip()  # no comment, no output redirection
            if line.startswith("vlgrpo "):
                build_parser().parse_args(shlex.split(line)[1:])  # SystemExit on an unknown flag or command
                commands += 1
            elif "scripts/" in line and "=" in line.split("scripts/")[0] or line.startswith("scripts/"):
                script = next(w for w in line.split() if w.startswith("scripts/"))
                assert (ROOT / script).is_file(), script
                commands += 1
    assert commands >= 1


@pytest.mark.parametrize(
    "name, line",
    [
        (
            "qwen2_5_vl_7b_lora_8xa100.yaml",
            "weight sync to the rollout engine: the LoRA adapter alone, 645.9 MB per step: vLLM serves qwen2_5_vl's "
            "LoRA adapter (measured)",
        ),
        (
            "qwen3_vl_8b_lora_8xa100.yaml",
            "weight sync to the rollout engine: 13.89 GB per step (the merged layers, in buckets of 512 MB; the whole "
            "model is 17.53 GB), ~0.07 s at a stated 200 GB/s in GPU memory (before buckets: the whole model, ~0.09 "
            "s); the adapter alone would be 698.4 MB: rollout.vllm.adapter_sync null: vLLM serving qwen3_vl's LoRA "
            "adapter is not shown (set it true to try)",
        ),
    ],
)
def test_the_adapter_only_sync_is_on_by_default_only_where_vllm_is_shown_to_serve_the_arch(name, line, capsys):
    """rollout.vllm.adapter_sync null (the default): the adapter alone for Qwen2.5-VL, whose LoRA adapter vLLM serves
    (test_vllm_train.py measures the gap); the merged model elsewhere (before: on for every arch, Qwen3.5's Gated
    DeltaNet projections included, which vLLM's LoRA path has not been shown to serve); `vlgrpo plan` says which and
    why. An explicit true still asks for it."""
    from vlgrpo.rollout.adapters import sync_mode

    assert main(["plan", str(ROOT / "configs" / name)]) == 0
    assert line in capsys.readouterr().out.splitlines()
    cfg = load_config(ROOT / "configs" / "qwen3_5_9b_lora_8xa100.yaml", ["rollout.vllm.adapter_sync=null"])
    assert sync_mode(cfg) == (
        False,
        "rollout.vllm.adapter_sync null: vLLM serving qwen3_5's LoRA adapter is not shown (set it true to try)",
    )
    cfg = load_config(ROOT / "configs" / "qwen3_5_9b_lora_8xa100.yaml", ["rollout.vllm.adapter_sync=true"])
    assert sync_mode(cfg) == (True, "rollout.vllm.adapter_sync is true")
