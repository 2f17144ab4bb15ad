#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py) on the device machine, in two calls of its `run` tool
# (at most 600 s each): part 1 links gsplat's prebuilt kernels and measures the tiers, the
# mmgp tiers and the renderers; part 2 the expert reload and the float32 fallback. Each part's
# steps have budgets that sum to at most 540 s, the build included; the check's sections take
# theirs from gpu_check.BUDGETS (passed as --budget SECTION=S), and the check runs under a hard
# limit of what is left of its part's sum, so a part ends within about 555 s. Everything goes
# to $OUT:
# part<N>.log (all output), part<N>-facts.json, part<N>-check.json (rewritten after every
# row: a part cut short keeps its rows), part1-build.log, python-include.tgz.
#
#   bash bench/gpu_device.sh --fetch-wheels    # here, with pip and a network: fill .whl/
#   python bench/gsplat_prebuild.py build --cache DIR  # here, no GPU: gsplat's sm_90 objects
#                                                     # in .kernels/ (~30 min on 2 busy cores)
#   bash bench/gpu_device.sh [--part 1|2]      # there (carry .whl, .kernels): one call's work
#   bash bench/gpu_device.sh [--part 1|2] --dry-run   # here: the plan, its budget sum, .whl/
#                                                     # holding the listed wheels and
#                                                     # .kernels/ built for them (part 1)
#
# A cold second call: part 2 builds nothing and trains (the float32 row) with the torch
# rasteriser, so it needs neither part 1's kernels nor a warm machine (one stays warm 30 s
# after a call; TORCH_EXTENSIONS_DIR is outside the checkout, so a warm one keeps them). Part 1
# takes gsplat's kernels from .kernels/ (bench/gsplat_prebuild.py: the 28 objects compiled here
# for sm_90; the device compiles ext.cpp, the Python module, against its own Python and links,
# as gsplat.csrc); only when they are missing, stale or fail to load does it JIT-build them
# (MAX_JOBS = the machine's cores; nvcc --version and CUDA_HOME in the build log). A failed or
# slow build is recorded and part 1 measures on the torch rasteriser instead (--render-backend
# torch: no parity, no gsplat timing). BENCHMARKS.md ("The GPU check on the device machine")
# gives the tool calls.
set -euo pipefail

LIMIT=540 # seconds, each part's budget sum: 60 s below the tool's 600 s per call
# the steps outside the check (seconds; the environment may change them): wheels installed,
# the facts, gsplat's build (nvcc for this card alone; 1-3 minutes on 16 cores, not yet
# measured there), and the check's setup before its first section (imports, the random
# expert, the VAE folder, the scene; in part 2 also writing the expert to disk: 15-40 s)
# install: 27.8 MiB of wheels unpacked without compiling, seconds on a quick disk; 45 s for a
# slow sandbox's (a timeout there ends the call under set -e before anything is measured).
# build: gsplat 1.5.3's 29 objects take 490-830 CPU-seconds here, ~31-52 s of 16 cores, but no
# less than the longest unit (79 s): 155 s is the JIT fallback's budget.
# link: ext.cpp alone compiled against the device's torch and Python (58 CPU-s here at -O3),
# the carried objects linked, then loaded and launched by chord build-kernels (two torch
# imports and a CUDA start): 120 s is ~1.3x that.
INSTALL=${INSTALL_S:-45}
FACTS=${FACTS_S:-30}
BUILD=${BUILD_S:-155}
LINK=${LINK_S:-120}
SETUP1=${SETUP1_S:-60}
SETUP2=${SETUP2_S:-90}
SECTIONS1="tiers mmgp render"
SECTIONS2="reload float32"
PY=${PYTHON:-python3}
WHEELS=${WHEELS_DIR:-.whl} # the carried wheels (bench/gpu_wheels.txt): --fetch-wheels fills it
KERNELS=${KERNELS_DIR:-.kernels} # gsplat's prebuilt objects (bench/gsplat_prebuild.py build)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

usage() {
    grep '^#   bash' "$0" | sed 's/^# *//' >&2
    exit 2
}

part=1 dry=0 fetch=0
while (($#)); do
    case $1 in
        --part) part=${2:-}; shift 2 || usage ;;
        --part=*) part=${1#--part=}; shift ;;
        --dry-run) dry=1; shift ;;
        --fetch-wheels) fetch=1; shift ;;
        *) usage ;;
    esac
done
[[ $part == 1 || $part == 2 ]] || { echo "--part: 1 or 2, got '$part'" >&2; exit 2; }

if ((fetch)); then
    # the device's platform: CPython 3.12 on x86-64 glibc Linux; libigl's wheel is tagged
    # manylinux_2_27/2_28 only, so manylinux2014 alone does not find it
    rm -rf "$WHEELS" && mkdir "$WHEELS"
    $PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -r bench/gpu_wheels.txt -d "$WHEELS"
    $PY bench/gpu_imports.py --check-wheels "$WHEELS"
    exit
fi

# the sections' budgets: gpu_check.BUDGETS, read without importing torch
declare -A BUDGET
ORDER=()
while read -r name seconds; do
    BUDGET[$name]=$seconds
    ORDER+=("$name")
done < <(
    $PY - <<'EOF'
import ast
tree = ast.parse(open("bench/gpu_check.py").read())
for node in tree.body:
    target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
    if getattr(target, "id", None) == "BUDGETS":
        for name, seconds in ast.literal_eval(node.value).items():
            print(name, int(round(seconds)))
EOF
)
for name in $SECTIONS1 $SECTIONS2; do
    [[ -n ${BUDGET[$name]:-} ]] || { echo "gpu_check.BUDGETS has no section $name" >&2; exit 2; }
done

prebuilt=0
if ((part == 1)); then
    # carried kernels current for the pins and .whl/'s gsplat: the build step is their link
    if kernels_note=$($PY bench/gsplat_prebuild.py check "$KERNELS" --wheels "$WHEELS" 2>&1); then
        prebuilt=1
    elif ((dry)); then # here: refused, as a stale .whl/ is, before a device second is spent
        echo "$kernels_note" >&2
        echo "part 1: $KERNELS/ is not gsplat's kernels for the pins; build it first:" \
            "python bench/gsplat_prebuild.py build --cache DIR" >&2
        exit 1
    fi
    sections=$SECTIONS1 setup=$SETUP1 build=$BUILD
    ((prebuilt)) && build=$LINK
    check_args=(--extras render_timing)
else
    sections=$SECTIONS2 setup=$SETUP2 build=0
    check_args=(--tiers "" --extras reload,float32 --render-backend torch)
fi
for name in "${ORDER[@]}"; do # every section: its budget in this part, else 0 (none)
    seconds=0
    [[ " $sections " == *" $name "* ]] && seconds=${BUDGET[$name]}
    check_args+=(--budget "$name=$seconds")
done

plan="install $INSTALL, facts $FACTS"
((build)) && plan+=", build $build"
plan+=", setup $setup"
total=$((INSTALL + FACTS + build + setup))
for name in $sections; do
    plan+=", $name ${BUDGET[$name]}"
    total=$((total + BUDGET[$name]))
done
echo "part $part: $plan"
echo "part $part: budget sum: $total s (limit $LIMIT s; the call's limit 600 s)"
if ((part == 1 && prebuilt)); then
    echo "part 1: gsplat: $kernels_note"
    echo "part 1: gsplat: build = link $LINK s (a JIT build, $BUILD s, only if they fail to" \
        "load, out of the sections' time)"
elif ((part == 1)); then
    echo "part 1: gsplat: no current $KERNELS/ (${kernels_note%%$'\n'*}): build = JIT $BUILD s"
fi
shown=() empty="''"
for arg in "${check_args[@]}"; do shown+=("${arg:-$empty}"); done
((part == 1)) && shown+=(--render-backend "auto (torch if the build fails)")
echo "part $part: check: bench/gpu_check.py --json \$OUT/part$part-check.json ${shown[*]}"
if ((total > LIMIT)); then
    echo "part $part: the budgets sum to $total s, over $LIMIT s: lower them" >&2
    exit 1
fi
# the wheels are carried from here: a missing or stale folder is refused here, not on the device
if ! $PY bench/gpu_imports.py --check-wheels "$WHEELS"; then
    echo "part $part: $WHEELS/ is not the wheels of bench/gpu_wheels.txt; fill it first:" \
        "bash bench/gpu_device.sh --fetch-wheels" >&2
    exit 1
fi
((dry)) && exit 0

: "${OUT:?OUT: the folder whose files come back (the device tool sets it)}"
START=$SECONDS
exec > >(tee -a "$OUT/part$part.log") 2>&1
step() { echo "== $(date -u +%H:%M:%S) +$((SECONDS - START)) s: $*"; }

step "install $WHEELS/ (budget $INSTALL s)"
timeout "$INSTALL" $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "$WHEELS"/*.whl
export PYTHONPATH=/tmp/site:$ROOT PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/chord-torch-extensions}

step "facts (budget $FACTS s)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
# the interpreter's C headers come back (~0.2 MB): no registry here serves CPython 3.12's, and
# with them bench/gsplat_prebuild.py could compile ext.cpp here too, leaving the device the link
pyinc=$($PY -c 'import sysconfig; print(sysconfig.get_path("include"))' || true)
((part == 1)) && { tar czf "$OUT/python-include.tgz" -C "$pyinc" . || echo "no $pyinc"; }
timeout "$FACTS" $PY - "$OUT/part$part-facts.json" <<'EOF' || echo "facts: failed (rc $?)"
import importlib.metadata, json, subprocess, sys
import torch

facts = {
    "python": sys.version.split()[0],
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    "capability": torch.cuda.get_device_capability() if torch.cuda.is_available() else None,
    # optimum-quanto int()s the sm_ entries at import on CUDA (its issue #361): sm_90a fails it
    "arch_list": torch.cuda.get_arch_list(),
}
for name in ("diffusers", "transformers", "huggingface-hub", "gsplat", "mmgp", "optimum-quanto"):
    facts[name] = importlib.metadata.version(name)
open(sys.argv[1], "w").write(json.dumps(facts, indent=2) + "\n")
imports = {
    "quanto_bare": "import optimum.quanto",
    "mmgp_as_chord_imports_it": "from chord.guidance.mmgp_residency import quanto_arch_list\n"
    "with quanto_arch_list():\n    import mmgp.offload",
}
for key, code in imports.items():  # each import in a fresh process, so neither helps the other
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=12)
    except subprocess.TimeoutExpired:
        facts[key] = "not done in 12 s"
    else:
        lines = proc.stderr.strip().splitlines()
        facts[key] = "ok" if proc.returncode == 0 else (lines[-1] if lines else f"rc {proc.returncode}")
    open(sys.argv[1], "w").write(json.dumps(facts, indent=2) + "\n")
print(json.dumps(facts, indent=2))
EOF

backend=auto
build_kernels() { # chord build-kernels under a limit of $1 s: gsplat.csrc or the JIT build
    timeout --kill-after=5 "$1" $PY -c \
        "import sys; from chord.cli.main import main; sys.exit(main(['build-kernels']))"
}
if ((build)); then
    log=$OUT/part$part-build.log
    rc=1
    if ((prebuilt)); then
        step "gsplat's kernels: $KERNELS/ linked (budget $build s; log ${log##*/})"
        began=$SECONDS rc=0
        timeout --kill-after=5 "$build" $PY bench/gsplat_prebuild.py link "$KERNELS" \
            --site /tmp/site >"$log" 2>&1 || rc=$?
        rest=$((build - (SECONDS - began)))
        ((rest > 0)) || rest=1 # timeout 0 would be none
        ((rc)) || build_kernels "$rest" >>"$log" 2>&1 || rc=$?
        tail -n 5 "$log"
        if ((rc)); then # the fallback takes what the plan leaves below LIMIT, then the sections'
            echo "gsplat: the prebuilt kernels failed (exit $rc): JIT build, budget $BUILD s"
            rm -f /tmp/site/gsplat/csrc.*so
            total=$((total + BUILD > LIMIT ? LIMIT : total + BUILD))
        fi
    fi
    if ((rc)); then
        build=$BUILD
        export MAX_JOBS=${MAX_JOBS:-$(nproc)}
        step "gsplat's kernels: JIT build, MAX_JOBS=$MAX_JOBS (budget $build s; log ${log##*/})"
        { # what the build runs with, first in its log
            echo "MAX_JOBS=$MAX_JOBS CUDA_HOME=${CUDA_HOME:-(unset)}"
            echo "nvcc on PATH: $(command -v nvcc || echo none)"
            $PY -c "from torch.utils import cpp_extension as c; print('torch', c.CUDA_HOME)" || true
            nvcc --version || true
        } >>"$log" 2>&1
        rc=0
        build_kernels "$build" >>"$log" 2>&1 || rc=$?
        tail -n 5 "$log"
    fi
    if ((rc)); then
        why="exit $rc"
        ((rc == 124 || rc == 137)) && why="not done in $build s"
        echo "gsplat build failed ($why): part $part measures on the torch rasteriser"
        backend=torch
    fi
fi
[[ " ${check_args[*]} " == *" --render-backend "* ]] || check_args+=(--render-backend "$backend")

left=$((total - (SECONDS - START)))
step "the check (sections: $sections; hard limit $left s)"
rc=0
timeout --kill-after=15 "$left" $PY bench/gpu_check.py --json "$OUT/part$part-check.json" \
    "${check_args[@]}" || rc=$?
((rc == 124 || rc == 137)) && echo "the check was stopped at part $part's limit: see its JSON"
step "done (check exit $rc)"
exit $rc
