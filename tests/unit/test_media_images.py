"""decode_image and load_images: formats to RGB, the pixel cap before decoding, truncated images,
EXIF orientation, the first frame of an animation, the per-prompt image limit."""

from __future__ import annotations

import base64
import io
import time
from dataclasses import replace
from typing import Any

import pytest

from djl_handlers.config.media import MediaOptions
from djl_handlers.errors import InvalidRequest
from djl_handlers.media.images import decode_image, image_digest, load_images
from djl_handlers.media.records import ImageRef

PART = "messages[1].content[0].image_url"
OPTIONS = MediaOptions()


def picture(size: tuple[int, int] = (40, 30)) -> Any:
    from PIL import Image

    image = Image.new("RGB", size)
    image.putdata([(x * 7 % 256, y * 11 % 256, (x * y) % 256) for y in range(size[1]) for x in range(size[0])])
    return image


def encode(image: Any, fmt: str, **kwargs: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def refusal(data: bytes, options: MediaOptions = OPTIONS) -> str:
    with pytest.raises(InvalidRequest) as info:
        decode_image(data, PART, options)
    assert info.value.status == 400
    assert info.value.field == PART
    return info.value.message


def test_png_decodes_to_the_same_rgb_pixels_and_digest() -> None:
    image = picture()
    loaded = decode_image(encode(image, "PNG"), PART, OPTIONS)
    assert loaded.part == PART
    assert (loaded.image.mode, loaded.image.size) == ("RGB", (40, 30))
    assert loaded.image.tobytes() == image.tobytes()
    assert loaded.digest == image_digest(image)
    assert decode_image(encode(image, "BMP"), PART, OPTIONS).digest == loaded.digest
    assert decode_image(encode(image, "WEBP", lossless=True), PART, OPTIONS).digest == loaded.digest


def test_different_pixels_have_different_digests() -> None:
    from PIL import Image

    image = picture()
    changed = image.copy()
    changed.putpixel((3, 4), (0, 0, 1) if image.getpixel((3, 4)) != (0, 0, 1) else (0, 0, 2))
    assert image_digest(image) != image_digest(changed)
    assert image_digest(Image.new("RGB", (2, 3))) != image_digest(Image.new("RGB", (3, 2)))  # same bytes


def test_jpeg_decodes_to_rgb() -> None:
    loaded = decode_image(encode(picture(), "JPEG", quality=95), PART, OPTIONS)
    assert (loaded.image.mode, loaded.image.size) == ("RGB", (40, 30))


def test_rgba_is_laid_on_white() -> None:
    from PIL import Image

    rgba = Image.new("RGBA", (4, 2), (10, 20, 30, 255))
    rgba.putpixel((0, 0), (200, 0, 0, 0))  # fully transparent
    rgba.putpixel((1, 0), (0, 0, 0, 128))  # half
    loaded = decode_image(encode(rgba, "PNG"), PART, OPTIONS)
    assert loaded.image.mode == "RGB"
    assert loaded.image.getpixel((0, 0)) == (255, 255, 255)
    assert loaded.image.getpixel((1, 0)) in ((127, 127, 127), (126, 126, 126))
    assert loaded.image.getpixel((2, 1)) == (10, 20, 30)


def test_palette_greyscale_and_cmyk_become_rgb() -> None:
    from PIL import Image

    palette = picture().convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    assert decode_image(encode(palette, "PNG"), PART, OPTIONS).image.tobytes() == palette.convert("RGB").tobytes()
    transparent = Image.new("P", (3, 1))
    transparent.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    transparent.putdata([0, 1, 1])
    loaded = decode_image(encode(transparent, "PNG", transparency=0), PART, OPTIONS)
    assert [loaded.image.getpixel((x, 0)) for x in range(3)] == [(255, 255, 255), (255, 0, 0), (255, 0, 0)]
    grey = Image.new("L", (2, 2), 77)
    assert decode_image(encode(grey, "PNG"), PART, OPTIONS).image.getpixel((1, 1)) == (77, 77, 77)
    cmyk = Image.new("CMYK", (2, 2), (0, 255, 255, 0))
    loaded = decode_image(encode(cmyk, "JPEG", quality=100), PART, OPTIONS)
    red, green, blue = loaded.image.getpixel((0, 0))
    assert loaded.image.mode == "RGB" and red > 200 and green < 60 and blue < 60


def test_16_bit_greyscale_keeps_its_top_8_bits() -> None:
    from PIL import Image

    deep = Image.new("I;16", (3, 1))
    deep.putdata([0, 0x8000, 0xFFFF])
    loaded = decode_image(encode(deep, "PNG"), PART, OPTIONS)
    assert [loaded.image.getpixel((x, 0)) for x in range(3)] == [(0, 0, 0), (128, 128, 128), (255, 255, 255)]


def test_an_animation_gives_its_first_frame() -> None:
    from PIL import Image

    frames = [Image.new("RGB", (8, 8), color).convert("P") for color in ((255, 0, 0), (0, 0, 255))]
    gif = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    loaded = decode_image(gif, PART, OPTIONS)
    assert loaded.image.getpixel((4, 4)) == (255, 0, 0)
    apng = encode(Image.new("RGB", (8, 8), (0, 255, 0)), "PNG", save_all=True,
                  append_images=[Image.new("RGB", (8, 8), (0, 0, 255))])
    assert decode_image(apng, PART, OPTIONS).image.getpixel((4, 4)) == (0, 255, 0)


def test_exif_orientation_is_applied() -> None:
    from PIL import Image

    image = picture((40, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: shown turned 90 degrees clockwise
    loaded = decode_image(encode(image, "PNG", exif=exif.tobytes()), PART, OPTIONS)
    assert loaded.image.size == (30, 40)
    assert loaded.image.tobytes() == image.transpose(Image.Transpose.ROTATE_270).tobytes()


def big_png() -> bytes:
    from PIL import Image

    return encode(Image.new("1", (7100, 7100)), "PNG")  # 50.4 megapixels in a few kilobytes


def test_too_many_pixels_are_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import ImageFile

    data = big_png()
    assert len(data) < 100_000

    def no_loading(self: Any) -> None:
        raise AssertionError("decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_loading)
    start = time.monotonic()
    message = refusal(data)
    assert time.monotonic() - start < 1.0
    assert "7100x7100 = 50410000 pixels" in message and "option.max_image_pixels" in message


def test_pillows_own_bomb_check_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    assert "option.max_image_pixels" in refusal(encode(picture((40, 30)), "PNG"))  # over twice Pillow's limit


def test_the_pixel_cap_allows_up_to_its_value() -> None:
    data = encode(picture((40, 30)), "PNG")
    assert decode_image(data, PART, replace(OPTIONS, max_image_pixels=1200)).image.size == (40, 30)
    assert "1200 pixels" in refusal(data, replace(OPTIONS, max_image_pixels=1199))


@pytest.mark.parametrize("load_truncated", [False, True])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF"])
def test_a_truncated_image_is_refused(fmt: str, load_truncated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", load_truncated)  # as another library may set it
    image = picture((64, 64))
    data = encode(image.convert("P") if fmt == "GIF" else image, fmt)
    assert decode_image(data, PART, OPTIONS).image.size == (64, 64)
    for cut in (len(data) // 2, len(data) * 3 // 4):
        assert "truncated or corrupt" in refusal(data[:cut])
    assert ImageFile.LOAD_TRUNCATED_IMAGES is load_truncated


@pytest.mark.parametrize("data", [b"", b"not an image", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20])
def test_what_is_not_an_image_is_refused(data: bytes) -> None:
    assert "not an image" in refusal(data)


def test_formats_outside_the_served_ones_are_refused() -> None:
    assert "not an image in a served format" in refusal(encode(picture(), "TIFF"))


def ref(index: int, url: str) -> ImageRef:
    return ImageRef(url=url, part=f"messages[0].content[{index}].image_url")


def data_url(image: Any) -> str:
    return "data:image/png;base64," + base64.b64encode(encode(image, "PNG")).decode()


def test_load_images_in_order() -> None:
    from PIL import Image

    images = [Image.new("RGB", (4, 4), (index * 40, 0, 0)) for index in range(3)]
    loaded = load_images([ref(index, data_url(image)) for index, image in enumerate(images)], OPTIONS)
    assert [item.part for item in loaded] == [f"messages[0].content[{index}].image_url" for index in range(3)]
    assert [item.digest for item in loaded] == [image_digest(image) for image in images]
    assert load_images([], OPTIONS) == []


def test_load_images_over_the_limit_names_the_first_extra_part() -> None:
    refs = [ref(index, data_url(picture((2, 2)))) for index in range(4)]
    with pytest.raises(InvalidRequest) as info:
        load_images(refs, replace(OPTIONS, limit_images=2))
    assert info.value.field == "messages[0].content[2].image_url"
    assert "option.limit_mm_per_prompt" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        load_images(refs[:1], replace(OPTIONS, limit_images=0))
    assert info.value.field == "messages[0].content[0].image_url"


def test_load_images_names_the_first_refused_part() -> None:
    refs = [ref(0, data_url(picture((2, 2)))), ref(1, "https://images.example.com/a.png"),
            ref(2, "https://images.example.com/b.png"), ref(3, "data:image/png;base64,***")]
    with pytest.raises(InvalidRequest) as info:
        load_images(refs, OPTIONS)  # remote URLs are off: the first remote part is named
    assert info.value.field == "messages[0].content[1].image_url"
    with pytest.raises(InvalidRequest) as info:
        load_images([refs[0], refs[3]], OPTIONS)
    assert info.value.field == "messages[0].content[3].image_url"
