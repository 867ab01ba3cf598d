"""Serialization & security rules (TR6xx): pickle-based loading, whole-module saving, resuming and loading
checkpoints, and the checkpoint files themselves.

One module per rule, named after its slug; a module whose name starts with ``_`` holds what several rules
here share and defines no rule. Most rules collect small facts while the engine walks the file (which loop a
call sits in, in which function, in what order) and decide in ``end_file``.
"""
