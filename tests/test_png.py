"""The PNG encoder of the run's curves: Pillow reads back the very pixels, size and resolution."""
import numpy as np
import pytest
from PIL import Image

from fedlatent.analysis import png


def _read(data: bytes, path) -> Image.Image:
    path.write_bytes(data)
    image = Image.open(path)
    image.load()
    return image


def test_opaque_pixels_round_trip_as_rgb(tmp_path) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (7, 13, 4), dtype=np.uint8)
    pixels[:, :, 3] = 255
    image = _read(png.encode(pixels, dpi=110), tmp_path / "a.png")
    assert image.mode == "RGB" and image.size == (13, 7)
    assert np.array_equal(np.asarray(image), pixels[:, :, :3])
    assert [round(v) for v in image.info["dpi"]] == [110, 110]


def test_translucent_pixels_keep_their_alpha(tmp_path) -> None:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (5, 3, 4), dtype=np.uint8)
    pixels[0, 0, 3] = 17
    image = _read(png.encode(pixels, dpi=72, level=9), tmp_path / "b.png")
    assert image.mode == "RGBA"
    assert np.array_equal(np.asarray(image), pixels)


def test_pixels_as_pillow_writes_them(tmp_path) -> None:
    """The same image as Pillow's own encoder of the same buffer."""
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (9, 4, 4), dtype=np.uint8)
    Image.fromarray(pixels, "RGBA").save(tmp_path / "pil.png")
    ours = _read(png.encode(pixels, dpi=110), tmp_path / "ours.png")
    assert np.array_equal(np.asarray(ours.convert("RGBA")), np.asarray(Image.open(tmp_path / "pil.png")))


@pytest.mark.parametrize("shape,dtype", [((4, 4, 3), np.uint8), ((4, 4), np.uint8), ((4, 4, 4), np.float32)])
def test_other_arrays_are_refused(shape, dtype) -> None:
    with pytest.raises(ValueError, match="RGBA"):
        png.encode(np.zeros(shape, dtype), dpi=110)
