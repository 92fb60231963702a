"""Scripts that run on the managed hosts with the host's own `python3` (stdlib only).

They are sent inline (`python3 - ARGS <<'EOF'`), so nothing of ours is installed on a
host just to inspect it, and a converged check stays one round trip.
"""

from pathlib import Path


def script(name: str) -> str:
    return (Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8")


def command(name: str, *args: str) -> str:
    """A shell command that runs remote script `name` with `args` (already shell-quoted)."""
    body = script(name)
    assert "\nPYEOF\n" not in body
    return f"python3 - {' '.join(args)} <<'PYEOF'\n{body}\nPYEOF"
