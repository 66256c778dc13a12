#!/usr/bin/env bash
# Builds .venv-lerobot: LeRobot 0.4.4 (its dataset and policy code), for the robot_video and
# lerobot_dropin benchmark cases to measure and compare LeRobotDataset beside blobhouse, and
# for train_dropin.py (LeRobot's training steps on a blobhouse table; blobhouse comes from the
# checkout, its dependencies from the lock). Not part of blobhouse's own environment:
# lerobot 0.4.4 declares torch<2.11, torchvision<0.26 and torchcodec<0.11 (and wandb, diffusers,
# opencv, ...), so it is installed without its dependencies on the CPU torch 2.13.0, and only
# what lerobot.datasets imports is added, pinned in requirements-lock.txt.
#
#   bench/lerobot_env/install.sh      # needs root for apt-get (FFmpeg's shared libraries)
#
# Why each odd step:
#  * video decoding: LeRobot uses torchcodec when it imports (its other backend, torchvision's
#    VideoReader, was removed in torchvision 0.26). torchcodec 0.13.0 is the newest wheel built
#    for the CPU torch (0.14+ link libtorch_cuda); it loads FFmpeg's shared libraries (4 to 8),
#    which Debian 12 ships as 5.1.
#  * torchvision: lerobot.datasets imports it. PyPI's 0.28.0 is a CUDA build whose compiled ops
#    cannot load beside the CPU torch, and its _meta_registrations.py then fails on an unguarded
#    register_fake("torchvision::nms"); those two decorators are guarded (the dataset code uses
#    torchvision's Python transforms only).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/bench/lerobot_env"
venv="${VENV:-$root/.venv-lerobot}"
python="${PYTHON:-python3.11}"

if ! ldconfig -p | grep -q 'libavcodec.so.59'; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends \
    libavutil57 libavcodec59 libavformat59 libavdevice59 libavfilter8 libswscale6 libswresample4
fi
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check)
# the CPU torch from this machine's disk: a bare `torch` would resolve to a CUDA build
"${pip[@]}" install torch==2.13.0 -c "$here/requirements-lock.txt"
"${pip[@]}" install --no-deps torchvision==0.28.0 torchcodec==0.13.0 lerobot==0.4.4
"${pip[@]}" install --no-deps -r "$here/requirements-lock.txt"
meta="$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
sed -i -E 's/^@torch\.library\.register_fake\(("torchvision::[a-z_]+")\)$/@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))/' "$meta"
grep -q '_has_ops() else (lambda f: f))' "$meta"
HF_HUB_OFFLINE=1 PYTHONPATH="$root" "$venv/bin/python" -c '
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401
from lerobot.policies.factory import make_policy  # noqa: F401  (train_dropin.py)
from blobhouse.lerobot import LeRobotDataset as Ours  # noqa: F401
from lerobot.datasets.video_utils import get_safe_default_codec
assert get_safe_default_codec() == "torchcodec", get_safe_default_codec()
print("lerobot ready, decoding with torchcodec")'
touch "$venv/.ready"  # what the robot_video case looks for
