#!/usr/bin/env bash
# Build a virtual environment that runs a OneTrainer checkout's scripts/train.py on CPU, with te-align installed,
# for tests/trainers/onetrainer/test_onetrainer_launch.py (TE_ALIGN_ONETRAINER_PYTHON=<VENV>/bin/python).
#
#   tools/onetrainer_env.sh VENV ONETRAINER_DIR MGDS_DIR [DIFFUSERS_DIR]
#
# VENV           the environment to create (a folder outside this repository; an existing one is reused)
# ONETRAINER_DIR a Nerogar/OneTrainer checkout (verified: 23df383); only read
# MGDS_DIR       Nerogar/mgds sources at the commit OneTrainer pins (3a6994a): the folder holding its
#                pyproject.toml; installed editable
# DIFFUSERS_DIR  huggingface/diffusers sources at the commit OneTrainer pins (1ffa423); when left out, the
#                release named by DIFFUSERS_RELEASE is installed from the package registry (default 0.39.0, the
#                first release whose history holds 1ffa423)
#
# OneTrainer's requirements-global.txt and requirements-default.txt (CPU), pinned as there, except:
# - torch/torchvision: OneTrainer pins torch 2.12.0 / torchvision 0.27.0 (CUDA or CPU builds from PyTorch's
#   own index, which an environment limited to the package registry cannot reach); TORCH_SPEC and
#   TORCHVISION_SPEC (default torch==2.14.1, torchvision==0.29.1, a matching pair of the package registry's
#   builds) choose others. The registry's torchvision is built against
#   its CUDA torch: with a CPU-only torch build its C extension does not load ("operator torchvision::nms does not
#   exist") and transformers' CLIPImageProcessor, which diffusers' SD pipelines import, fails; the CUDA build of
#   torch runs on CPU;
# - the git+https requirements (diffusers, mgds, Muon) come from local sources (see above; Muon is left out:
#   only its optimizer needs it);
# - left out, not imported on the scripts/train.py path: yt-dlp, scenedetect (video tools), scalene (profiler),
#   customtkinter and PySide6 (GUI; WITH_GUI=1 installs PySide6 and scenedetect, which the Qt GUI imports),
#   runpod and fabric (cloud training), pre-commit.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,27p' "$0"
    exit 2
fi
VENV=$1
OT_DIR=$2
MGDS_DIR=$3
DIFFUSERS_DIR=${4:-}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1}
TORCHVISION_SPEC=${TORCHVISION_SPEC:-torchvision==0.29.1}

for f in scripts/train.py requirements-global.txt; do
    [ -f "$OT_DIR/$f" ] || { echo "not a OneTrainer checkout: $OT_DIR/$f is missing" >&2; exit 2; }
done
[ -d "$MGDS_DIR" ] || { echo "no mgds sources at $MGDS_DIR" >&2; exit 2; }

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)

# torch first, so that nothing below pulls another build
"${PIP[@]}" "$TORCH_SPEC" "$TORCHVISION_SPEC" "onnxruntime==1.23.2"

# requirements-global.txt, as pinned there (minus the git+https lines and the packages named above)
"${PIP[@]}" \
    "numpy==2.2.6" "opencv-python==4.11.0.86" "pillow==12.3.0" "imagesize==1.4.1" "tqdm==4.67.1" \
    "PyYAML==6.0.2" "huggingface-hub==1.22.0" "scipy==1.15.3" "matplotlib==3.10.3" "av==16.1.0" \
    "parse==1.20.2" "setuptools==81.0.0" \
    "accelerate==1.12.0" "safetensors==0.8.0" "tensorboard==2.20.0" \
    "gguf==0.17.1" "transformers==5.5.4" "sentencepiece==0.2.1" "omegaconf==2.3.0" "invisible-watermark==0.2.0" \
    "pooch==1.8.2" "open-clip-torch==2.32.0" \
    "dadaptation==3.2" "lion-pytorch==0.2.3" "prodigyopt==1.1.2" "schedulefree==1.4.1" "pytorch_optimizer==3.6.0" \
    "prodigy-plus-schedule-free==2.0.1" "adv_optm==2.2.3" \
    "psutil==7.2.2" "requests==2.34.2" "deepdiff==8.6.2" \
    "$TORCH_SPEC" "$TORCHVISION_SPEC"

# diffusers and mgds from local sources (editable, like OneTrainer's -e git+ lines)
if [ -n "$DIFFUSERS_DIR" ]; then
    "${PIP[@]}" --no-deps -e "$DIFFUSERS_DIR"
else
    "${PIP[@]}" --no-deps "diffusers==${DIFFUSERS_RELEASE:-0.39.0}"
fi
# mgds takes its version from git (setuptools-scm); a source folder without .git names it here
SETUPTOOLS_SCM_PRETEND_VERSION_FOR_MGDS=${MGDS_VERSION:-0.0.0+3a6994a} "${PIP[@]}" --no-deps -e "$MGDS_DIR"

# te-align itself (its own dependencies that OneTrainer's list does not bring)
"${PIP[@]}" "toml>=0.10.2" "ftfy>=6.1" "beautifulsoup4>=4.12" "peft>=0.13" "pytest>=8" "$TORCH_SPEC"
"${PIP[@]}" --no-deps -e "$HERE"
# WITH_GUI=1: also what OneTrainer's Qt GUI (scripts/train_ui_qt.py) imports, for the launch test's GUI start
if [ "${WITH_GUI:-0}" = 1 ]; then
    "${PIP[@]}" "PySide6==6.11.1" "scenedetect==0.7"
fi

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
for name in ("torch", "torchvision", "transformers", "diffusers", "mgds", "accelerate", "huggingface-hub",
             "safetensors", "numpy", "av", "peft", "te-align"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
EOF
echo "done: TE_ALIGN_ONETRAINER_PYTHON=$VENV/bin/python TE_ALIGN_ONETRAINER_DIR=$OT_DIR"
