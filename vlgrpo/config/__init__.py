"""The whole run configuration: the dataclass tree (`schema`) and how it is loaded (`load`) and validated (`validate`).

YAML files hold only what differs from the defaults; `a.b=c` overrides apply on top; `validate` explains every
rejection (the key, the accepted values, why). Knows nothing of models or data.
"""

from vlgrpo.config.load import field_docs, load_config, save_config, to_dict
from vlgrpo.config.schema import (
    CHOICES,
    EVAL_SUITES,
    Config,
    ConfigError,
    DataConfig,
    EvalConfig,
    GRPOConfig,
    LoggingConfig,
    LoRAConfig,
    ModelConfig,
    OverlongConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    VLLMConfig,
    Zero3Config,
)
from vlgrpo.config.validate import get_key, validate

__all__ = [
    "CHOICES",
    "EVAL_SUITES",
    "Config",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "GRPOConfig",
    "LoggingConfig",
    "LoRAConfig",
    "ModelConfig",
    "OverlongConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainConfig",
    "VLLMConfig",
    "Zero3Config",
    "field_docs",
    "get_key",
    "load_config",
    "save_config",
    "to_dict",
    "validate",
]
