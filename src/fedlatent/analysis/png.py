"""PNG encoding of a canvas' pixels, written here because Pillow spends ~7 ms on the learning
curves' 990×352 canvas at any compression level (its per-row filter search), the wait a run's
end has for its last figure; rows without a filter, RGB when every pixel is opaque and zlib at
level 1 take ~2.5 ms for a file of the same size. Lossless: the pixels read back are the canvas'."""
from __future__ import annotations

import struct
import zlib

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
INCH_M = 0.0254


def encode(pixels: np.ndarray, dpi: float, level: int = 1) -> bytes:
    """The PNG of (height, width, 4) uint8 RGBA ``pixels`` (straight alpha, as Agg's buffer holds
    them): 8-bit RGB when every pixel is opaque, else RGBA; each row unfiltered (filter type 0),
    the rows deflated at zlib ``level``; ``dpi`` as the physical pixel size (the pHYs chunk)."""
    if pixels.ndim != 3 or pixels.shape[2] != 4 or pixels.dtype != np.uint8:
        raise ValueError(f"expected (height, width, 4) uint8 RGBA pixels, got {pixels.shape} {pixels.dtype}")
    height, width, _ = pixels.shape
    opaque = bool((pixels[:, :, 3] == 255).all())
    channels = 3 if opaque else 4
    rows = np.zeros((height, 1 + width * channels), np.uint8)  # each row: its filter byte (0), then pixels
    body = rows[:, 1:].reshape(height, width, channels)  # a view of the rows' pixel bytes
    for channel in range(channels):  # channel by channel: ~4x faster than one copy of an (h, w, 3) slice
        body[:, :, channel] = pixels[:, :, channel]
    per_metre = round(dpi / INCH_M)
    colour_type = 2 if opaque else 6  # truecolour, or truecolour with alpha
    return b"".join([SIGNATURE,
                     _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)),
                     _chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
                     _chunk(b"IDAT", zlib.compress(rows.tobytes(), level)),
                     _chunk(b"IEND", b"")])


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
