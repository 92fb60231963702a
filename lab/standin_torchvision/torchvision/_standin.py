"""What every name of the stand-in does: refuse to be used, naming the stand-in."""

WHAT = "the lab's torchvision stand-in (lab/standin_torchvision), which has no image ops"


def refusing(name: str):
    """A callable (function or class) that raises RuntimeError when called."""

    def refuse(*args, **kwargs):
        raise RuntimeError(f"{name}: {WHAT}")

    refuse.__name__ = refuse.__qualname__ = name.rsplit(".", 1)[-1]
    return refuse


def missing_in(module: str):
    """A module's `__getattr__`: any name it does not define is an AttributeError naming the stand-in."""

    def __getattr__(name):
        raise AttributeError(f"module {module!r} has no attribute {name!r}: {WHAT}")

    return __getattr__
