# The README's two commands: `make serve` (set up + serve the default model) and `make test`.
.PHONY: setup setup-vllm serve test test-full lint bench robustness serve-djl docker

setup:
	bash scripts/setup.sh

serve: setup
	.venv/bin/djl-handlers serve $(MODEL_DIR)

# `make test` (the README's and CI's command) leaves out the tests marked `full`: costly second proofs of
# paths the default run already proves. `make test-full` runs everything.
PYTEST_SELECT ?= -m "not full"

test:
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider --ignore=tests/vllm_cpu $(PYTEST_SELECT)
	@if [ -x .venv-vllm/bin/python ]; then \
	  echo "real vLLM on CPU (.venv-vllm), one process per file:"; \
	  status=0; for f in tests/vllm_cpu/test_*.py; do \
	    HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_SELECT) $$f; \
	    rc=$$?; if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then status=1; fi; \
	  done; test $$status -eq 0; \
	else echo "tests/vllm_cpu skipped: run 'make setup-vllm' to create .venv-vllm"; fi

test-full:
	$(MAKE) test PYTEST_SELECT=

setup-vllm:
	bash scripts/setup_vllm_cpu.sh

lint:
	.venv/bin/ruff check djl_handlers tests benchmarks
	.venv/bin/mypy
	.venv/bin/lint-imports

bench:
	HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks $(or $(BENCH),all)

serve-djl: setup
	.venv/bin/python tests/djl_serving/djl_server.py --version $(or $(DJL_VERSION),0.34) $(or $(MODEL_DIR),serving.properties.examples/hf-rolling-batch)

robustness:
	HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.robustness

docker:
	bash docker/build.sh $(ARGS)
