"""The research tests (`make test-dev`) use the product suite's fixtures: the tiny checkpoints and the shapes data
(tests/conftest.py, loaded under a name of its own: this file is `conftest` too)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "product_conftest", Path(__file__).resolve().parents[2] / "tests" / "conftest.py"
)
_product = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_product)
globals().update({k: v for k, v in vars(_product).items() if not k.startswith("_") and k != "collect_ignore"})
