"""The CPU kernel patches of an HF model, applied together (the loader calls :func:`apply`) and
reverted together (:func:`revert`).

Each patch replaces a ``forward`` (or, for rotary embedding, a modeling module's function; for
attention, the model's attention implementation) and keeps what it replaced, so :func:`revert`
gives the plain transformers model back. Which patches run is ``option.cpu_*``
(:class:`~djl_handlers.config.hf.HuggingFaceOptions`); a model not on the CPU gets none.
"""

from __future__ import annotations

import logging
from typing import Any

from djl_handlers.config.hf import HuggingFaceOptions
from djl_handlers.engines.hf.cpu import ragged_attention, rotary
from djl_handlers.engines.hf.cpu.fused import fuse_projections, unfuse_projections
from djl_handlers.engines.hf.cpu.linear import prepack_linears, unpack_linears
from djl_handlers.engines.hf.cpu.norm import fuse_rms_norms, unfuse_rms_norms
from djl_handlers.errors import ConfigError

__all__ = ["apply", "revert", "use_ragged_attention"]

LOG = logging.getLogger(__name__)


def _on_cpu(model: Any) -> bool:
    first = next(iter(model.parameters()), None)
    return first is not None and first.device.type == "cpu"


def apply(model: Any, options: HuggingFaceOptions) -> None:
    """Patch ``model`` (on the CPU) as ``options`` say: oneDNN linear layers (``cpu_linear``) with fused
    projections (``cpu_fuse_projections``), RMSNorm (``cpu_norm``), rotary embedding (``cpu_rotary``),
    ragged attention (``cpu_attention``). A kernel that cannot be built here is logged and skipped,
    except ``cpu_attention=ragged`` (a ``ConfigError``)."""
    if not _on_cpu(model):
        return
    if options.cpu_linear == "onednn":
        prepack_linears(model)
        if options.cpu_fuse_projections:
            fuse_projections(model)  # checked against the unfused forward; logs and keeps them apart if not
    if options.cpu_norm == "fused":
        fuse_rms_norms(model)
    if options.cpu_rotary == "fused":
        rotary.enable(model)  # bitwise torch's
    if options.cpu_attention != "sdpa":
        use_ragged_attention(model, required=options.cpu_attention == "ragged")


def revert(model: Any) -> None:
    """Undo every patch :func:`apply` may have made (those it did not make are left alone)."""
    ragged_attention.disable(model)
    rotary.disable(model)
    unfuse_rms_norms(model)
    unfuse_projections(model)
    unpack_linears(model)


def use_ragged_attention(model: Any, required: bool) -> None:
    """Switch a CPU model on SDPA to the ragged decode attention (``option.cpu_attention``); when
    its kernel cannot be built, raise if ``required``, else warn and keep SDPA."""
    from djl_handlers.kernels.decode_attention import unavailable_reason

    if ragged_attention.enable(model):
        LOG.info("option.cpu_attention: decode steps attend over real tokens only (ragged kernel)")
        return
    why = unavailable_reason()
    if why is None:  # built, but the model does not use SDPA (eager, flash, ...): its choice stands
        LOG.info("option.cpu_attention: the model uses %r attention, not sdpa; kept",
                 model.config._attn_implementation)
        return
    if required:
        raise ConfigError(f"option.cpu_attention=ragged needs its C kernel, which cannot be built here: {why}",
                          field="option.cpu_attention")
    LOG.warning("decode attention stays on torch's SDPA: the ragged kernel cannot be built here (%s)", why)
