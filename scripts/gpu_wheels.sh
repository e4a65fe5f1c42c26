#!/usr/bin/env bash
# Download, here, the pure-Python wheels that the lent GPU machine's image lacks, into .whl/ at the
# repository root (git-ignored through .git/info/exclude), for the device tool to carry:
#
#     bash scripts/gpu_wheels.sh      # then run(carry=[".whl"], command="bash scripts/gpu_check.sh")
#
# The image (see ../.library/device/KINDS.md) has python3 3.12 with torch (CUDA), transformers,
# accelerate, peft, tokenizers, httpx, tensorboard, matplotlib and tqdm, but not hydra, omegaconf,
# gymnasium or docker; nothing can be downloaded there. vLLM's CUDA wheels are far over the
# device tool's 64 MiB carry limit, so on that image gpu_check.sh skips its vLLM stages.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
PY="${PY:-python3}"
# the versions this repository's venv runs; antlr4 4.9.3 is a source release: built to a wheel here
"$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl hydra-core==1.3.8 omegaconf==2.3.1 \
  gymnasium==1.4.0 farama-notifications==0.0.6 docker==7.2.0
ls -la .whl
du -sh .whl
