"""Videos given as frame lists, prepared as verl 0.9.1 prepares them for Qwen2.5-VL: its
`process_video` calls qwen_vl_utils' `fetch_video` (each frame fetched as an image, the count
padded to an even number with the last frame, the stack resized with torchvision's bicubic
antialiased resize) and the dataset hands the result to transformers' `Qwen2VLVideoProcessor`
(resize to its bounds, fused rescale and normalisation, patches of two frames).

Usage: video_oracle.py videos OUT
Writes OUT/<case>_<frame>.png (the frames), OUT/videos.json (per case its frames, the fetched
stack's shape, the processor's `video_grid_thw` and the seconds per temporal patch) and
OUT/videos.safetensors (per case `<case>.pixel_values`, the processor's `pixel_values_videos`).

Usage: video_oracle.py qwen3 OUT MODEL_ORACLE
Rows with videos as verl's dataset prepares them for Qwen3-VL (`process_video` with 16-pixel
patches and the video's metadata, then `Qwen3VLProcessor` with `do_sample_frames=False`): its
video processor bounds the whole video, and its prompt holds each temporal patch apart behind
its timestamp. Writes the frames, OUT/tok (a BPE tokenizer with Qwen-VL's special tokens and
a chat template that renders image and video parts), OUT/qwen3.json (per row its prompt,
its videos' frame files, the processor's `size`, input ids and grids) and OUT/qwen3.safetensors
(`<row>.pixel_values_videos`).

Usage: video_oracle.py files OUT MODEL_ORACLE
Rows whose videos are files (made here with FFmpeg: H.264 at 30000/1001 frames a second, VP9,
Motion JPEG, large frames, H.264 turned by its display matrix), read as verl 0.9's dataset reads them for Qwen3-VL: qwen_vl_utils'
`fetch_video` with torchcodec (frame sampling by `fps`/`nframes` and a time range, the stack's
pixel bounds), then `Qwen3VLProcessor` with the videos' metadata. Writes the files, OUT/tok,
OUT/files.json (per row its prompt, its video cells as verl's rows hold them, the sampled frame
indices, the frame rates torchcodec measured, input ids and grids, and the prompt's length as
verl's dataset measures it, fetching on 14-pixel patches) and OUT/files.safetensors (`<row>.pixel_values_videos`).
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


TEMPLATE = (
    "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def vl_tokenizer(out, model_oracle):
    """model_oracle's BPE tokenizer with Qwen-VL's vision tokens and TEMPLATE, saved in OUT/tok."""
    from transformers import Qwen2TokenizerFast

    sys.path.insert(0, os.path.dirname(os.path.abspath(model_oracle)))
    from model_oracle import bpe_tokenizer

    tok = bpe_tokenizer()
    tok.add_special_tokens(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                              unk_token=None, bos_token=None)
    fast.chat_template = TEMPLATE
    fast.save_pretrained(os.path.join(out, "tok"))
    return fast


def qwen3(out, model_oracle):
    import re
    from PIL import Image
    from qwen_vl_utils import fetch_video
    from transformers.models.qwen2_vl.image_processing_qwen2_vl_fast import Qwen2VLImageProcessorFast
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(11)

    def frames(case, count, w, h):
        names = []
        for i in range(count):
            data = torch.randint(0, 256, (h, w, 3), generator=gen, dtype=torch.uint8).numpy()
            name = f"{case}_{i}.png"
            Image.fromarray(data, "RGB").save(os.path.join(out, name), format="PNG")
            names.append(name)
        return names

    fast = vl_tokenizer(out, model_oracle)
    mean = [0.5, 0.5, 0.5]
    images = Qwen2VLImageProcessorFast(patch_size=16, image_mean=mean, image_std=mean)
    # (row, text, videos as (frames, width, height), the video processor's size): an odd
    # count padded with its last frame; two videos in a turn; a long video the class's own
    # size (128 to 768 merged 32-pixel patches for all frames together) scales down; the
    # released checkpoints' size (4096 to 25165824 pixels), which does not bind here.
    rows = [
        ("odd", "<video>What happens?", [(3, 90, 60)], None),
        ("two", "First <video>, then <video>. Same?", [(2, 64, 64), (4, 120, 70)], None),
        ("long", "Count the frames: <video>", [(8, 300, 200)], None),
        ("released", "<video>Describe.", [(6, 200, 150)], {"shortest_edge": 4096, "longest_edge": 25165824}),
    ]
    results, tensors = [], {}
    for name, text, shapes, size in rows:
        names = [frames(f"{name}{k}", *shape) for k, shape in enumerate(shapes)]
        videos_cells = [{"video": [os.path.join(out, f) for f in files]} for files in names]
        video_processor = Qwen3VLVideoProcessor(**({"size": size} if size else {}))
        processor = Qwen3VLProcessor(image_processor=images, tokenizer=fast, video_processor=video_processor,
                                     chat_template=TEMPLATE)
        # verl's `_build_messages`: the text split at its placeholders into parts.
        parts = [{"type": "video"} if seg == "<video>" else {"type": "text", "text": seg}
                 for seg in re.split("(<video>)", text) if seg]
        messages = [{"role": "user", "content": parts}]
        raw = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # verl 0.7's RL dataset: process_video (qwen_vl_utils' fetch_video at the processor's
        # patch size, with the metadata), then the processor without frame sampling.
        fetched = [fetch_video(dict(cell), image_patch_size=16, return_video_metadata=True) for cell in videos_cells]
        videos, metadata = [v for v, _ in fetched], [m for _, m in fetched]
        batch = processor(text=[raw], videos=videos,
                          videos_kwargs={"video_metadata": metadata, "do_sample_frames": False}, return_tensors="pt")
        vp = processor.video_processor
        results.append({
            "row": name,
            "prompt": [{"role": "user", "content": text}],
            "videos": names,
            "size": [vp.size["shortest_edge"], vp.size["longest_edge"]],
            "input_ids": batch["input_ids"][0].tolist(),
            "video_grid_thw": batch["video_grid_thw"].tolist(),
        })
        tensors[f"{name}.pixel_values_videos"] = batch["pixel_values_videos"].contiguous()
    with open(os.path.join(out, "qwen3.json"), "w") as f:
        json.dump(results, f)
    save_file(tensors, os.path.join(out, "qwen3.safetensors"))


def files(out, model_oracle):
    import re
    import subprocess
    # qwen_vl_utils reads this when imported: torchcodec, its first choice, named so that a
    # missing torchcodec fails here instead of falling back to another reader.
    os.environ["FORCE_QWENVL_VIDEO_READER"] = "torchcodec"
    from qwen_vl_utils import fetch_video
    from transformers.models.qwen2_vl.image_processing_qwen2_vl_fast import Qwen2VLImageProcessorFast
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    os.makedirs(out, exist_ok=True)
    out = os.path.abspath(out)

    def make(name, size, rate, seconds, codec):
        path = os.path.join(out, name)
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc2=size={size}:rate={rate}:duration={seconds}", *codec, path], check=True)
        return name

    def turned(src, name, matrix):
        """SRC with its track header's display matrix set to MATRIX (16.16 fixed point):
        FFmpeg 5.1 writes no rotation, a phone does."""
        import struct
        data = bytearray(open(os.path.join(out, src), "rb").read())
        box = data.find(b"tkhd") - 4
        at = box + (48 if data[box + 8] == 0 else 60)
        data[at:at + 36] = struct.pack(">9i", *matrix, 0, 0, 0x40000000)
        open(os.path.join(out, name), "wb").write(bytes(data))
        return name

    h264 = ["-c:v", "libx264", "-pix_fmt", "yuv420p"]
    ntsc = make("ntsc.mp4", "96x64", "30000/1001", 2.5, h264)
    vp9 = make("vp9.webm", "80x60", 15, 3, ["-c:v", "libvpx-vp9"])
    mjpeg = make("mjpeg.avi", "70x50", 25, 1.6, ["-c:v", "mjpeg"])
    big = make("big.mp4", "700x500", 10, 1.2, h264)
    one = 0x10000
    portrait = turned(ntsc, "portrait.mp4", [0, one, 0, -one, 0, 0])  # -90 degrees
    upside = turned(ntsc, "upside.mp4", [-one, 0, 0, 0, -one, 0])  # 180 degrees

    fast = vl_tokenizer(out, model_oracle)
    mean = [0.5, 0.5, 0.5]
    processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessorFast(patch_size=16, image_mean=mean, image_std=mean),
                                 tokenizer=fast, video_processor=Qwen3VLVideoProcessor(), chat_template=TEMPLATE)
    # (row, text, video cells as verl's rows hold them): a bare path at the default two
    # frames a second; a file:// URL sampled at 4 fps beside a fixed frame count; a time range;
    # a whole-video pixel budget that makes the frames' bound fractional and binds; files whose
    # display matrix turns them a quarter and a half turn (torchcodec turns the RGB frames).
    rows = [
        ("path", "<video>What is shown?", [ntsc]),
        ("sampled", "First <video>, then <video>. Same?",
         [{"video": "file://" + vp9, "fps": 4.0}, {"video": mjpeg, "nframes": 6}]),
        ("range", "<video>When?", [{"video": ntsc, "video_start": 0.5, "video_end": 2.0, "fps": 3}]),
        ("budget", "Describe <video>", [{"video": big, "nframes": 6, "total_pixels": 1000003}]),
        ("turned", "<video> and <video>", [{"video": portrait, "nframes": 4}, {"video": upside, "nframes": 4}]),
    ]
    results, tensors = [], {}
    for name, text, cells in rows:
        # verl's `_build_messages`: the text split at its placeholders into parts, each video
        # part the row's cell (a path becomes `{"video": path}`).
        parts = [{"type": "video"} if seg == "<video>" else {"type": "text", "text": seg}
                 for seg in re.split("(<video>)", text) if seg]
        messages = [{"role": "user", "content": parts}]
        raw = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # The cells name their files relative to OUT (the directory moves into the oracle's
        # cache); the reader gets them in place.
        def placed(name):
            return "file://" + os.path.join(out, name[7:]) if name.startswith("file://") else os.path.join(out, name)
        eles = [{"video": placed(c)} if isinstance(c, str) else {**c, "video": placed(c["video"])} for c in cells]
        fetched = [fetch_video(ele, image_patch_size=16, return_video_metadata=True) for ele in eles]
        videos, metadata = [v for v, _ in fetched], [m for _, m in fetched]
        batch = processor(text=[raw], videos=videos,
                          videos_kwargs={"video_metadata": metadata, "do_sample_frames": False}, return_tensors="pt")
        # verl's dataset measures the prompt for filter_overlong_prompts fetching on
        # `data.image_patch_size` (14 in its configs) instead of the processor's 16.
        measure = [fetch_video(ele, image_patch_size=14, return_video_metadata=True) for ele in eles]
        measured = processor(text=[raw], videos=[v for v, _ in measure],
                             videos_kwargs={"video_metadata": [m for _, m in measure], "do_sample_frames": False},
                             return_tensors="pt")
        results.append({
            "row": name,
            "prompt": [{"role": "user", "content": text}],
            "videos": cells,
            "measured_len": measured["input_ids"].shape[1],
            "indices": [[int(i) for i in m["frames_indices"]] for m in metadata],
            "fps": [m["fps"] for m in metadata],
            "input_ids": batch["input_ids"][0].tolist(),
            "video_grid_thw": batch["video_grid_thw"].tolist(),
        })
        tensors[f"{name}.pixel_values_videos"] = batch["pixel_values_videos"].contiguous()
    with open(os.path.join(out, "files.json"), "w") as f:
        json.dump(results, f)
    save_file(tensors, os.path.join(out, "files.safetensors"))


if __name__ == "__main__":
    commands = {"videos": videos, "qwen3": qwen3, "files": files}
    if sys.argv[1] not in commands:
        sys.exit(f"unknown command {sys.argv[1]}")
    commands[sys.argv[1]](*sys.argv[2:])
