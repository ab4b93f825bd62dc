"""Decoding the images of a request into checked RGB images with their pixel digest.

``decode_image`` opens PNG, JPEG, GIF, WebP and BMP only, and reads the size
from the header: an image over ``option.max_image_pixels`` is refused before its pixels are decoded.
It then decodes fully: a truncated or corrupt image is a 400, never a partial image, also where
another library set Pillow's global ``ImageFile.LOAD_TRUNCATED_IMAGES`` (the reads past the data's
end are watched; the global is never changed). Of an animated image the first frame is taken; the
EXIF orientation is applied; transparent pixels are laid on white (as vLLM does) and every mode
becomes RGB. The digest is SHA-256 over the mode, the size and the RGB pixels.

``load_images`` checks the count against ``option.limit_mm_per_prompt``, fetches the remote images
in parallel and decodes all in request order. Pillow is imported on the first call.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from djl_handlers.config.media import MediaOptions
from djl_handlers.errors import InvalidRequest
from djl_handlers.media.fetch import fetch_bytes
from djl_handlers.media.records import ImageRef, LoadedImage

__all__ = ["FORMATS", "decode_image", "image_digest", "load_images"]

FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")  # Pillow opens a camera MPO as JPEG
_FETCH_THREADS = 4


class _WatchedBytes(io.BytesIO):
    """The image data, noting a read that found nothing left while the pixels were decoded."""

    loading = False
    starved = False

    def read(self, size: int | None = -1, /) -> bytes:
        data = super().read(size)
        if self.loading and not data and size != 0:
            self.starved = True
        return data


def decode_image(data: bytes, part: str, options: MediaOptions) -> LoadedImage:
    """The RGB image ``data`` holds, within ``options.max_image_pixels``; an ``InvalidRequest``
    naming ``part`` otherwise."""
    from PIL import Image, ImageFile, ImageOps

    _register_formats()
    stream = _WatchedBytes(data)
    try:
        image = Image.open(stream, formats=FORMATS)
    except Image.DecompressionBombError:
        raise _too_many_pixels(part, None, options.max_image_pixels) from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:  # Pillow's UnidentifiedImageError is an OSError
        raise InvalidRequest(f"{part}: the data is not an image in a served format ({', '.join(FORMATS)}): "
                             f"{_reason(exc)}", field=part) from None
    with image:
        width, height = image.size
        if width * height > options.max_image_pixels:
            raise _too_many_pixels(part, (width, height), options.max_image_pixels)
        stream.loading = True
        try:
            image.load()
        except Image.DecompressionBombError:
            raise _too_many_pixels(part, (width, height), options.max_image_pixels) from None
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise _corrupt(part, _reason(exc)) from None
        stream.loading = False
        if stream.starved and ImageFile.LOAD_TRUNCATED_IMAGES:
            raise _corrupt(part, "the data ends before the image does")
        try:
            ImageOps.exif_transpose(image, in_place=True)
            rgb = _to_rgb(image)  # a new image: closing the opened one ends its pixels
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise _corrupt(part, _reason(exc)) from None
    return LoadedImage(image=rgb, digest=image_digest(rgb), part=part)


def image_digest(image: Any) -> bytes:
    """SHA-256 over ``image``'s mode, size and pixels (the prefix cache's key of an image)."""
    digest = hashlib.sha256(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    digest.update(image.tobytes())
    return digest.digest()


def load_images(refs: Sequence[ImageRef], options: MediaOptions) -> list[LoadedImage]:
    """The decoded images of ``refs`` in order; an ``InvalidRequest`` naming the first refused part."""
    if len(refs) > options.limit_images:
        extra = refs[options.limit_images]
        raise InvalidRequest(f"{extra.part}: the request carries {len(refs)} images; the server takes at most "
                             f"{options.limit_images} per prompt (option.limit_mm_per_prompt)", field=extra.part)
    remote = [index for index, ref in enumerate(refs) if ref.url.lstrip()[:8].lower().startswith(("http:", "https:"))]
    if len(remote) < 2:
        return [decode_image(fetch_bytes(ref, options), ref.part, options) for ref in refs]
    pool = ThreadPoolExecutor(max_workers=min(_FETCH_THREADS, len(remote)), thread_name_prefix="image-fetch")
    try:
        fetched: dict[int, Future[bytes]] = {index: pool.submit(fetch_bytes, refs[index], options)
                                             for index in remote}
        images = []
        for index, ref in enumerate(refs):
            data = fetched[index].result() if index in fetched else fetch_bytes(ref, options)
            images.append(decode_image(data, ref.part, options))
        return images
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _register_formats() -> None:
    """Pillow registers only some formats before its first open; ``formats=`` needs all of ours."""
    from PIL import (  # noqa: F401
        BmpImagePlugin,
        GifImagePlugin,
        JpegImagePlugin,
        PngImagePlugin,
        WebPImagePlugin,
    )


def _to_rgb(image: Any) -> Any:
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit greyscale: keep the top 8 bits
        image = image.point(lambda value: value / 256).convert("L")
    return image.convert("RGB") if image.mode != "RGB" else image.copy()


def _too_many_pixels(part: str, size: tuple[int, int] | None, limit: int) -> InvalidRequest:
    shown = f"{size[0]}x{size[1]} = {size[0] * size[1]} pixels" if size else "too many pixels"
    return InvalidRequest(f"{part}: the image is {shown}, over the server's limit of {limit} pixels "
                          "(option.max_image_pixels); send a smaller image", field=part)


def _corrupt(part: str, reason: str) -> InvalidRequest:
    return InvalidRequest(f"{part}: the image is truncated or corrupt ({reason}); send the complete file",
                          field=part)


def _reason(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__
