"""The serving virtualenv: generations built from a pinned stack (venv), the installer (uv), the
ABI probe and the generation switch (on_host/), patch sets copied into the installed sglang
(patches), and the sandbox the engine's code runs in outside its unit (transient).
"""
