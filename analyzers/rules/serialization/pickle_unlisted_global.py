"""TR621 pickle-unlisted-global: a checkpoint imports a global that weights_only=True loading refuses."""
from __future__ import annotations

from analyzers.model import Category, Severity
from analyzers.rules.serialization._checkpoint_files import CheckpointFileRule


class PickleImportsUnlistedGlobal(CheckpointFileRule):
    id = "TR621"
    syntactic = True
    slug = "pickle-unlisted-global"
    category = Category.SECURITY
    severity = Severity.LOW
    summary = "a checkpoint imports a global that weights_only=True loading refuses"
    what = """
        Flags globals a pickle-based file imports that are neither on the allowlist of torch's
        weights-only unpickler (tensor and storage rebuilds, dtypes, `collections.OrderedDict`,
        `torch.Size`, the few builtins it accepts) or NumPy's array reconstruction, nor known to
        run code: `argparse.Namespace`, a project's own config class, a tokenizer object.
    """
    why = """
        `torch.load(path, weights_only=True)`, the default since torch 2.6, refuses such a file,
        so users turn weights-only off, and then every global in the file is imported and called.
        The class itself may be harmless; its `__setstate__` or `__reduce__` is code of that
        module. Saving plain data (a state dict, a dict of numbers and strings) keeps the file
        loadable with weights-only.
    """
    example = """
        torch.save({"model": model.state_dict(), "args": args}, "model.pt")  # args: argparse.Namespace
    """
    fix_example = """
        torch.save({"model": model.state_dict(), "args": vars(args)}, "model.pt")
    """
