"""TR622 malformed-checkpoint: a checkpoint file that cannot be read as its format: a broken pickle or safetensors
header.
"""
from __future__ import annotations

from analyzers.model import Category, Severity
from analyzers.rules.serialization._checkpoint_files import CheckpointFileRule


class MalformedCheckpoint(CheckpointFileRule):
    id = "TR622"
    syntactic = True
    slug = "malformed-checkpoint"
    category = Category.SECURITY
    severity = Severity.HIGH
    summary = "a checkpoint file that cannot be read as its format: a broken pickle or safetensors header"
    what = """
        Flags a pickle-based file whose opcodes cannot be read to the end (an unknown opcode, a
        truncated argument, a zip checkpoint without `data.pkl`), and a `.safetensors` file whose
        header is invalid: the 8-byte little-endian length past the end of the file or above
        100 MB, a header that is not a JSON object, a tensor whose dtype is unknown, whose shape is
        not a list of non-negative integers, or whose `data_offsets` lie outside the data, disagree
        with its dtype and shape, or overlap another tensor.
    """
    why = """
        A pickle is executed opcode by opcode: whatever comes before the unreadable part still
        runs when it is loaded, and a scanner cannot vouch for what it could not read. A bad
        safetensors header is either a corrupt upload or an attempt to make a loader read out of
        bounds or allocate without limit.
    """
    example = """
        # model.safetensors: header says data_offsets [0, 4096] for a 16-byte tensor
    """
    fix_example = """
        # Regenerate the file with the library that writes it (safetensors.torch.save_file).
    """
