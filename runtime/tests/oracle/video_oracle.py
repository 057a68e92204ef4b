"""Videos given as frame lists, prepared as verl 0.9.1 prepares them for Qwen2.5-VL: its
`process_video` calls qwen_vl_utils' `fetch_video` (each frame fetched as an image, the count
padded to an even number with the last frame, the stack resized with torchvision's bicubic
antialiased resize) and the dataset hands the result to transformers' `Qwen2VLVideoProcessor`
(resize to its bounds, fused rescale and normalisation, patches of two frames).

Usage: video_oracle.py videos OUT
Writes OUT/<case>_<frame>.png (the frames), OUT/videos.json (per case its frames, the fetched
stack's shape, the processor's `video_grid_thw` and the seconds per temporal patch) and
OUT/videos.safetensors (per case `<case>.pixel_values`, the processor's `pixel_values_videos`).
"""
import io
import json
import os
import sys

import torch
from safetensors.torch import save_file


def videos(out):
    from PIL import Image
    from qwen_vl_utils import fetch_video
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(5)

    def frames(case, count, w, h):
        names, images = [], []
        for i in range(count):
            data = torch.randint(0, 256, (h, w, 3), generator=gen, dtype=torch.uint8).numpy()
            img = Image.fromarray(data, "RGB")
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            name = f"{case}_{i}.png"
            with open(os.path.join(out, name), "wb") as f:
                f.write(buf.getvalue())
            names.append(name)
            images.append(Image.open(io.BytesIO(buf.getvalue())))
        return names, images

    # (case, frames, width, height): an odd count (padded with its last frame), frames the
    # fetch scales down, frames it scales up to the video's minimum.
    cases = [("odd", 3, 90, 60), ("large", 4, 300, 200), ("small", 2, 40, 30)]
    processor = Qwen2VLVideoProcessor()
    results, tensors = [], {}
    for case, count, w, h in cases:
        names, images = frames(case, count, w, h)
        video, fps = fetch_video({"video": images}, image_patch_size=14, return_video_sample_fps=True)
        batch = processor(videos=[video], do_sample_frames=False, return_tensors="pt")
        results.append({
            "case": case,
            "frames": names,
            "fetched": list(video.shape),
            "grid_thw": batch["video_grid_thw"][0].tolist(),
            "seconds_per_grid": processor.temporal_patch_size / fps,
        })
        tensors[f"{case}.pixel_values"] = batch["pixel_values_videos"].contiguous()
    with open(os.path.join(out, "videos.json"), "w") as f:
        json.dump(results, f)
    save_file(tensors, os.path.join(out, "videos.safetensors"))


if __name__ == "__main__":
    if sys.argv[1] != "videos":
        sys.exit(f"unknown command {sys.argv[1]}")
    videos(*sys.argv[2:])
