"""The lab's torchvision stand-in (lab/standin_torchvision): a deterministic wheel whose names import and refuse to run."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

from configuration.stacks import load_stack

ROOT = Path(__file__).resolve().parents[2]


def _load_build():
    spec = importlib.util.spec_from_file_location("standin_torchvision_build", ROOT / "lab" / "standin_torchvision" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _load_build()
# The module-level imports of torchvision on the way to `python -m sglang.bench_serving` (sglang 0.5.23:
# srt/multimodal/internvl_utils.py, srt/configs/deepseek_ocr.py; transformers 5.19: image_utils.py and the
# image processors' `transforms.v2`).
IMPORTS = """
import torchvision.transforms as T
from torchvision.transforms.functional import InterpolationMode
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.functional import pil_to_tensor
from torchvision.transforms.v2 import functional as F
"""


def test_the_wheel_is_deterministic_and_its_record_lists_every_file(tmp_path):
    first, again = build.build_wheel(tmp_path / "a"), build.build_wheel(tmp_path / "b")
    assert first.name == "torchvision-0.28.0+standin-py3-none-any.whl"
    assert first.read_bytes() == again.read_bytes()
    with zipfile.ZipFile(first) as wheel:
        names = wheel.namelist()
        record = wheel.read("torchvision-0.28.0+standin.dist-info/RECORD").decode()
        for name in names[:-1]:
            digest = base64.urlsafe_b64encode(hashlib.sha256(wheel.read(name)).digest()).rstrip(b"=").decode()
            assert f"{name},sha256={digest},{len(wheel.read(name))}" in record
        assert "Name: torchvision\nVersion: 0.28.0+standin\n" in wheel.read("torchvision-0.28.0+standin.dist-info/METADATA").decode()
    assert not any(n.endswith(".so") or "__pycache__" in n for n in names)


def test_the_bench_stacks_pin_is_this_build(tmp_path):
    (pin,) = [p for p in load_stack("lab-cpu-sglang-bench").packages if p.name == "torchvision"]
    wheel = build.build_wheel(tmp_path)
    assert (pin.version, pin.file, pin.build) == ("0.28.0+standin", wheel.name, "lab/standin_torchvision/build.py")
    assert pin.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest(), "rebuild the pin: python3 lab/standin_torchvision/build.py DIR"


def test_the_names_import_and_every_one_refuses_to_run(tmp_path):
    with zipfile.ZipFile(build.build_wheel(tmp_path / "out")) as wheel:
        wheel.extractall(tmp_path / "site")
    script = IMPORTS + """
import torchvision
print(torchvision.__version__, torchvision.STANDIN, T.InterpolationMode.BICUBIC.value, ImageReadMode.RGB.value)
for call in (lambda: T.Compose([]), lambda: decode_image(b""), lambda: pil_to_tensor(None), lambda: F.resize(None, 1)):
    try:
        call()
    except RuntimeError as exc:
        print("refused:", exc)
try:
    T.RandomCrop
except AttributeError as exc:
    print("missing:", exc)
try:
    from torchvision.ops import nms
except ImportError as exc:
    print("no ops:", type(exc).__name__)
"""
    env = {"PYTHONPATH": str(tmp_path / "site"), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-s", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "0.28.0+standin True bicubic 3"
    assert lines[1:5] == [
        f"refused: torchvision.{name}: the lab's torchvision stand-in (lab/standin_torchvision), which has no image ops"
        for name in ("transforms.Compose", "io.decode_image", "transforms.functional.pil_to_tensor", "transforms.v2.functional.resize")]
    assert lines[5] == ("missing: module 'torchvision.transforms' has no attribute 'RandomCrop': "
                        "the lab's torchvision stand-in (lab/standin_torchvision), which has no image ops")
    assert lines[6] == "no ops: ModuleNotFoundError"
