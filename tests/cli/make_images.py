#!/usr/bin/env python3
"""Writes COUNT small PNG images (pseudo-random pixels, RGB and gray, sizes around 30 x 40) into
DIR, for the calibration tests: python3 make_images.py DIR COUNT. Standard library only."""
import os
import random
import struct
import sys
import zlib


def png(width: int, height: int, channels: int, pixels: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    color_type = {1: 0, 3: 2}[channels]  # gray, RGB
    row = width * channels
    raw = b"".join(b"\x00" + pixels[y * row:(y + 1) * row] for y in range(height))  # filter 0 per row
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def main() -> None:
    folder, count = sys.argv[1], int(sys.argv[2])
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(5)
    for i in range(count):
        width, height, channels = 40, 30 + i, 3 if i % 2 == 0 else 1
        pixels = bytes(rng.randrange(256) for _ in range(width * height * channels))
        with open(os.path.join(folder, f"img{i}.png"), "wb") as f:
            f.write(png(width, height, channels, pixels))


if __name__ == "__main__":
    main()
