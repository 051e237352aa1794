# make demo: the bundled model, every decoder, PNGs in demo_out/ and the bench table.
# make test: the whole test suite (the command CI runs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_IMAGES ?= 16

.PHONY: install demo test test-engine-457 bench-tiny

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m ssd_core bench --model reference --heads reference --decoders ar,ssd,ssd-exact,sjd,zipar \
		--ssd-rounds 0,1,2 --images $(DEMO_IMAGES) --verify-cost --out-dir demo_out --json demo_out/bench.json

test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q tests
	node --test tests/js/

# the engine tests under transformers 4.57 (the other supported major version)
test-engine-457:
	$(PYTHON) -m venv .venv457
	.venv457/bin/python -m pip install -q torch==2.13.0 transformers==4.57.6 safetensors accelerate numpy pillow scipy pytest hypothesis
	OMP_NUM_THREADS=1 .venv457/bin/python -m pytest -q tests/test_engine_exact.py tests/test_engine_decoders.py tests/test_errors.py \
		tests/test_train_cli.py tests/test_family_janus.py tests/test_family_emu3.py tests/test_family_lumina.py \
		tests/test_family_heads.py tests/test_loading.py tests/test_vqgan.py tests/test_bad_inputs.py
