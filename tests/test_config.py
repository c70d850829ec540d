import dataclasses

import pytest
import yaml

from vlgrpo.config import CHOICES, Config, ConfigError, field_docs, load_config, save_config, validate


def test_defaults_validate_and_every_field_is_documented():
    cfg = Config()
    validate(cfg)

    def walk(obj, prefix=""):
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                assert docs.get(f.name), f"config field {prefix}{f.name} has no attribute docstring"

    walk(cfg)


def test_yaml_holds_only_differences_and_overrides_win(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 3.0e-6\n  lora:\n    rank: 8\nrollout:\n  completions_per_prompt: 4\n")
    cfg = load_config(path, ["train.lr=1e-4", "grpo.beta=0.04", "rollout.stop=[</answer>]", "eval.suites=pope,vqa"])
    assert cfg.train.lr == 1e-4  # override beats the file
    assert cfg.train.lora.rank == 8 and cfg.train.lora.alpha == 32  # untouched defaults stay
    assert cfg.rollout.completions_per_prompt == 4
    assert cfg.grpo.beta == 0.04
    assert cfg.rollout.stop == ["</answer>"]
    assert cfg.eval.suites == ["pope", "vqa"]


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["train.steps=7", "model.max_pixels=50176"])
    save_config(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["train"]["steps"] == 7 and saved["model"]["max_pixels"] == 50176
    again = load_config(tmp_path / "config.yaml")
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)


def test_unknown_key_names_key_accepted_keys_and_suggestion(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.learning_rate=1e-5"])
    msg = str(e.value)
    assert "train.learning_rate" in msg and "prompts_per_step" in msg
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  completions_per_promt: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and "Did you mean 'rollout.completions_per_prompt'" in str(e.value)


def test_invalid_choice_lists_accepted_values():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["grpo.aggregation=mean"])
    assert "grpo.aggregation" in str(e.value)
    for accepted in CHOICES["grpo.aggregation"]:
        assert accepted in str(e.value)


def test_batch_divisibility_explains_why():
    with pytest.raises(ConfigError) as e:
        load_config(
            None, ["train.prompts_per_step=3", "rollout.completions_per_prompt=4", "train.micro_batch_completions=8"]
        )
    assert "3 prompts x 4 = 12" in str(e.value) and "micro_batch_completions (8)" in str(e.value)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.lr=fast", "must be a number"),
        ("train.steps=1.5", "must be an integer"),
        ("model.freeze_vision=maybe", "true or false"),
        ("rollout.completions_per_prompt=1", "group of one"),
        ("grpo.dual_clip=0.5", "grpo.dual_clip"),
        ("eval.suites=pope,mmbench", "accepted suites"),
        ("train", "section.key=value"),
        ("train=3", "is a section"),
        # issue #17: each of these was accepted and failed (or silently never learnt) later
        ("logging.log_every=0", "'logging.log_every' must be >= 1"),
        ("train.lr=.inf", "'train.lr' must be a finite number, got inf"),
        ("grpo.beta=.nan", "'grpo.beta' must be a finite number"),
        ("train.max_grad_norm=-1", "'train.max_grad_norm' must be >= 0"),
        ("train.save_every=-1", "'train.save_every' must be >= 0"),
        ("train.max_nonfinite_steps=0", "'train.max_nonfinite_steps' must be >= 1"),
        ("train.fault_timeout_s=-1", "'train.fault_timeout_s' must be >= 0 seconds"),
        (
            "rollout.vllm.limit_mm_per_prompt={image: 2, video: 3}",
            "'rollout.vllm.limit_mm_per_prompt.video' must be 0 or 1",
        ),
        ("rollout.vllm.limit_mm_per_prompt={audio: 1}", "accepted modalities: image, video"),
        ("train.lr=[1", "override 'train.lr=[1' is not valid YAML"),
        ("data.video.fps=0", "'data.video.fps' must be > 0"),
        ("data.video.max_frames=1", "'data.video.max_frames' must be >= 2"),
    ],
)
def test_bad_values_fail_with_reason(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert fragment in str(e.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_a_group_of_one_is_refused_for_every_advantage_estimator():
    for advantage in CHOICES["grpo.advantage"]:  # batch too: it centres on the group mean before scaling
        with pytest.raises(ConfigError, match=f"grpo.advantage={advantage} included.*never learns"):
            load_config(None, ["rollout.completions_per_prompt=1", f"grpo.advantage={advantage}"])
    sft = load_config(None, ["rollout.completions_per_prompt=1", "train.stage=sft", "train.micro_batch_completions=2"])
    assert sft.rollout.completions_per_prompt == 1  # SFT samples nothing


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("train:\n  lr: 1e-5\n  steps: [3\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert f"config file '{path}' is not valid YAML at line 4, column 1" in msg and "<unicode string>" not in msg


def test_offload_keys_beside_a_deepspeed_json_are_refused():
    """The JSON is what DeepSpeed runs: train.zero3.offload_optimizer=true next to it changed nothing, silently."""
    with pytest.raises(ConfigError) as e:
        load_config(
            None,
            [
                "train.backend=zero3",
                "train.zero3.deepspeed_config=configs/ds_zero3_bf16.json",
                "train.zero3.offload_optimizer=true",
            ],
        )
    assert "zero_optimization.offload_optimizer.device: cpu" in str(e.value)
    assert "configs/ds_zero3_bf16.json" in str(e.value)
    load_config(None, ["train.backend=zero3", "train.zero3.offload_optimizer=true"])  # vlgrpo builds the JSON: fine


def test_the_watchdog_must_fire_before_the_process_group_times_out():
    load_config(None, ["train.fault_timeout_s=600", "train.dist_timeout_s=901"])
    with pytest.raises(
        ConfigError, match=r"train.fault_timeout_s.*x 1.5 \(900 s.*below train.dist_timeout_s \(900 s\)"
    ):
        load_config(None, ["train.fault_timeout_s=600", "train.dist_timeout_s=900"])
    load_config(None, ["train.fault_timeout_s=0", "train.dist_timeout_s=60"])  # watchdog off: any timeout


def test_data_thinking_reads_yaml_on_and_off_as_the_switch_not_booleans(tmp_path):
    """YAML 1.1 reads `on` / `off` as true / false: data.thinking takes them as the switch's values."""
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  thinking: off\n")
    assert load_config(path).data.thinking == "off"
    assert load_config(None, ["data.thinking=on"]).data.thinking == "on"
    assert load_config(None, ["data.thinking=true"]).data.thinking == "on"
    with pytest.raises(ConfigError, match="data.thinking' = 'maybe' is not accepted; use one of: auto, on, off"):
        load_config(None, ["data.thinking=maybe"])
    with pytest.raises(ConfigError, match="data.answer_format' must be a string"):
        load_config(None, ["data.answer_format=false"])  # other string keys still refuse a boolean


def test_prefill_once_is_decided_from_the_config_for_the_device():
    from vlgrpo.config.prefill import prefill_once

    cfg = load_config(None, ["model.name_or_path=m", "data.train=t.jsonl"])
    assert prefill_once(cfg, "cpu") == (True, "the update's prompt pass is the rollout's prefill")
    assert prefill_once(cfg, "cuda")[0] is False  # auto: the CPU only
    on = load_config(None, ["model.name_or_path=m", "data.train=t.jsonl", "train.prefill_once=on"])
    assert prefill_once(on, "cuda")[0] is True
    for override, why in [
        ("rollout.engine=vllm", "holds its own weights"),
        ("grpo.num_iterations=2", "the weights move"),
        ("model.freeze_vision=false", "trainable vision tower"),
        ("train.lora.target_modules=[visual.blocks.0.attn.qkv]", None),  # plain backend: lora targets not read
        ("train.prefill_once=off", "is off"),
    ]:
        cfg = load_config(None, ["model.name_or_path=m", "data.train=t.jsonl", override])
        applies, reason = prefill_once(cfg, "cpu")
        assert applies is (why is None) and (why is None or why in reason), (override, reason)
