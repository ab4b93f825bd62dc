"""Model configuration: serving.properties + ``OPTION_*`` env → a validated ``ServingConfig``."""

from djl_handlers.config.hf import HuggingFaceOptions
from djl_handlers.config.models import (
    DeepSpeedOptions,
    ServingConfig,
    TrtLlmOptions,
    VllmOptions,
)
from djl_handlers.config.properties import (
    ModelProperties,
    load_model_properties,
    parse_properties,
    read_serving_properties,
    resolve_entry_point,
)

__all__ = [
    "DeepSpeedOptions",
    "HuggingFaceOptions",
    "ModelProperties",
    "ServingConfig",
    "TrtLlmOptions",
    "VllmOptions",
    "load_model_properties",
    "parse_properties",
    "read_serving_properties",
    "resolve_entry_point",
]
