"""Build the bundled demo video clips, ``demo/sage_plugin_demo/data/vlm/videos/*.mp4``, from the bundled photos.

Each clip is a slow camera move over one openly licensed photo already bundled in
``demo/sage_plugin_demo/data/vlm`` (a pan or a zoom: a crop box moved linearly from ``start`` to ``end``, both ``(left, top, right, bottom)`` as fractions of the
photo), 16 frames at 8 fps (2 s), 160x120, H.264 in MP4 (torchcodec's encoder over FFmpeg's libx264, CRF 23; its
bytes differ a little from run to run).  The clips inherit the photo's licence (CC0 or public domain: ``videos/README.md``).  Run once, offline; the clips
are committed, so nothing here runs in tests::

    python tools/build_vlm_clips.py          # rewrites demo/sage_plugin_demo/data/vlm/videos/*.mp4

Needs torchcodec with FFmpeg's shared libraries (``tools/setup.sh`` installs them on Debian).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

VLM = Path(__file__).resolve().parents[1] / "demo" / "sage_plugin_demo" / "data" / "vlm"
FRAMES, FPS, SIZE = 16, 8, (160, 120)

#: clip name -> (photo under vlm/, crop box at the first frame, crop box at the last frame)
CLIPS: dict[str, tuple[str, tuple[float, ...], tuple[float, ...]]] = {
    "chelsea_pan": ("skimage_photos/images/chelsea.png", (0.0, 0.1, 0.6, 0.9), (0.4, 0.1, 1.0, 0.9)),
    "coffee_zoom": ("skimage_photos/images/coffee.png", (0.0, 0.0, 1.0, 1.0), (0.3, 0.25, 0.75, 0.85)),
    "astronaut_zoom": ("skimage_photos/images/astronaut.png", (0.0, 0.0, 1.0, 1.0), (0.25, 0.05, 0.7, 0.6)),
    "rocket_tilt": ("skimage_photos/images/rocket.jpg", (0.2, 0.4, 0.8, 1.0), (0.2, 0.0, 0.8, 0.6)),
}


def frames(photo: Path, start: tuple[float, ...], end: tuple[float, ...]) -> torch.Tensor:
    """``[FRAMES, 3, H, W]`` uint8: the crop box moved linearly from ``start`` to ``end``, each crop resized."""
    img = Image.open(photo).convert("RGB")
    w, h = img.size
    out = []
    for i in range(FRAMES):
        t = i / (FRAMES - 1)
        box = [a + (b - a) * t for a, b in zip(start, end)]
        crop = img.crop((box[0] * w, box[1] * h, box[2] * w, box[3] * h)).resize(SIZE, Image.Resampling.LANCZOS)
        out.append(torch.from_numpy(np.array(crop)).permute(2, 0, 1))
    return torch.stack(out)


def main() -> int:
    from torchcodec.encoders import VideoEncoder

    out_dir = VLM / "videos"
    out_dir.mkdir(exist_ok=True)
    for name, (photo, start, end) in CLIPS.items():
        path = out_dir / f"{name}.mp4"
        VideoEncoder(frames(VLM / photo, start, end), frame_rate=FPS).to_file(path, codec="libx264", crf=23)
        print(f"{path.relative_to(VLM)}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
