"""Checks on a request's image references before anything is fetched or decoded."""

from __future__ import annotations

from collections.abc import Sequence

from djl_handlers.errors import InvalidRequest
from djl_handlers.media.records import ImageRef

__all__ = ["check_image_count"]


def check_image_count(refs: Sequence[ImageRef], limit: int) -> None:
    """A 400 naming the first image part past ``limit`` (0: the model takes text only)."""
    if not refs or len(refs) <= limit:
        return
    if limit == 0:
        raise InvalidRequest(f"{refs[0].part}: this model takes text only; remove the image parts",
                             field=refs[0].part)
    extra = refs[limit]
    raise InvalidRequest(f"{extra.part}: a prompt may carry at most {limit} image(s) "
                         f"(option.limit_mm_per_prompt), this one has {len(refs)}", field=extra.part)
