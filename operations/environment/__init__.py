"""The serving virtualenv: generations built from a pinned stack (venv; what a generation is and
its read: venv_read; what a build does: venv_decide; installed files copied in: venv_copy), the
installer (uv), the ABI probe (venv_probe) and the generation switch (on_host/), patch sets copied
into the installed sglang (patches), and the sandbox the engine's code runs in outside its unit
(transient).
"""
