# The README's two commands: `make serve` (set up + serve the default model) and `make test`.
.PHONY: setup serve test lint bench robustness serve-djl docker

setup:
	bash scripts/setup.sh

serve: setup
	.venv/bin/djl-handlers serve $(MODEL_DIR)

test:
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider

lint:
	.venv/bin/ruff check djl_handlers tests benchmarks
	.venv/bin/mypy

bench:
	HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks

serve-djl: setup
	.venv/bin/python -m djl_handlers.djl_server $(or $(MODEL_DIR),serving.properties.examples/hf-rolling-batch)

robustness:
	HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.robustness

docker:
	bash docker/build.sh $(ARGS)
