"""Target of the `torch.backends` entry point, so that `import torch` alone loads mydev.

It lives outside my_device/__init__.py because `import my_device` itself
imports torch, which runs the entry point while my_device is half imported;
this module can always be imported, and importing the package does the work."""


def load():
    import my_device  # noqa: F401
