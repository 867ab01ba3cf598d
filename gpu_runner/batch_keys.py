"""Batches that are dicts: a training step that reads its batch by key (``images = batch["image"].to(device)``,
``x, y = batch["x"], batch["y"]``) gets a loader of dicts, each key holding what the step does with it (issue 27,
item 4): the runner's batch is ``(inputs..., target)`` for the model it built, and a key is the model's i-th input
when the step passes it (or a name assigned from it) as the model's i-th positional argument, the target when the
step compares the model's output with it (``criterion(output, batch["label"])``: a call whose first argument is
the model's output and whose second is the key); a target the step casts to integers
(``batch["mask"].to(dtype=torch.long)``) holds class indices, not the runner's scores; a key compared with one of
several outputs the step unpacks (``a, b = model(x)``; ``criterion(b.transpose(1, 2), batch["tags"])``) holds
class indices shaped for that output, its classes on dimension 1 of what is compared. A key the step reads for
anything else (a mask, an index, a length), or a batch unpacked into the model's keywords (``model(**batch)``): the
runner does not guess what a key holds, the batches stay tuples (a step that makes its own loader runs on it as
before), and a step that then raises on them is skipped naming the key.
"""
from __future__ import annotations

import ast
from typing import Any, Callable, Optional

import torch

# tensor methods that give the same data (device, dtype, layout): ``batch["x"].to(device).float()`` is still "x"
_SAME_DATA = {"to", "cuda", "cpu", "float", "long", "int", "half", "double", "bfloat16", "contiguous", "type"}


_INTEGER_DTYPES = {"long", "int64", "int", "int32", "LongTensor", "IntTensor"}


def _casts_to_integer(call: ast.AST) -> bool:
    """``x.long()``, ``x.to(dtype=torch.long)``, ``x.to(device, torch.long)``, ``x.type(torch.LongTensor)``."""
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return False
    if call.func.attr in ("long", "int"):
        return True
    if call.func.attr not in ("to", "type"):
        return False
    values = list(call.args) + [k.value for k in call.keywords if k.arg in ("dtype", None)]
    return any(isinstance(v, ast.Attribute) and v.attr in _INTEGER_DTYPES for v in values)


def class_indices(target: torch.Tensor) -> torch.Tensor:
    """A floating target as the class indices a step that casts it to integers reads: the index of the largest of
    its classes (dimension 1: ``[B, C, ...]`` scores or one-hot rows) where it has them, else its values rounded
    and kept non-negative."""
    if target.dim() >= 2 and target.shape[1] > 1:
        return target.argmax(dim=1)
    return target.round().clamp(min=0).long()


class KeysUnknown(Exception):
    """The step reads its batch by keys, and what one of them holds cannot be told from the step."""


def _batch_names(node: ast.AST, role_of: Callable[[str], Optional[str]]) -> set[str]:
    """The step's names for a batch: a parameter named like one, a loop's variable over a loader (``for batch in
    loader``, ``for i, batch in enumerate(tqdm(loader))``, or over a name assigned such an iterable first)."""
    names = {a.arg for a in node.args.args + node.args.kwonlyargs if role_of(a.arg) == "batch"}

    # an iterable named first (``data_iter = tqdm(enumerate(loader)); for i, data in data_iter``, or
    # ``bar = tqdm(loader); for i, data in enumerate(bar)``)
    named = {n.targets[0].id: n.value for n in ast.walk(node) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Name)}

    def loader_in(expression: ast.AST, depth: int = 2) -> bool:
        return any(isinstance(n, ast.Name) and (role_of(n.id) == "loader" or depth > 0 and n.id in named
                                                and loader_in(named[n.id], depth - 1))
                   or isinstance(n, ast.Attribute) and role_of(n.attr) == "loader" for n in ast.walk(expression))

    def enumerates(expression: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "enumerate"
                   for n in ast.walk(expression))

    for loop in ast.walk(node):
        iterable = loop.iter if isinstance(loop, (ast.For, ast.AsyncFor)) else None
        if isinstance(iterable, ast.Name) and iterable.id in named:
            iterable = named[iterable.id]
        if iterable is not None and loader_in(iterable):
            target = loop.target
            if isinstance(target, ast.Tuple) and enumerates(iterable) and len(target.elts) == 2:
                target = target.elts[1]
            if isinstance(target, ast.Name):
                names.add(target.id)
    return names


def _element_target(output: Any, compared: ast.AST) -> Optional[torch.Tensor]:
    """Class indices for one output of a model that returns several (``a, b = model(x)``), compared with a key as
    ``criterion(b, key)`` or ``criterion(b.transpose(1, 2), key)``: the classes are dimension 1 of what is compared
    (the convention of ``cross_entropy`` / ``nll_loss``), the target that shape without it, its values cycling
    through the classes. None for an output that is not a float tensor of at least two dimensions, or compared
    through anything but a transpose of constant dimensions."""
    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.dim() < 2:
        return None
    shape = list(output.shape)
    if isinstance(compared, ast.Call):
        if not (isinstance(compared.func, ast.Attribute) and compared.func.attr == "transpose"
                and len(compared.args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, int)
                                                    for a in compared.args)):
            return None
        first, second = (a.value % len(shape) for a in compared.args)
        shape[first], shape[second] = shape[second], shape[first]
    elif not isinstance(compared, ast.Name):
        return None
    classes = shape[1]
    rest = shape[:1] + shape[2:]
    count = 1
    for size in rest:
        count *= size
    return (torch.arange(count, device=output.device) % classes).reshape(rest)


def keyed_batch(node: ast.AST, batch: tuple, role_of: Callable[[str], Optional[str]],
                self_is_model: bool = False, outputs: Optional[Callable[[], Any]] = None) -> Optional[dict]:
    """``{key: tensor}`` for a step (its function's ``ast`` node) that reads its batch by string keys, from the
    runner's ``batch`` (inputs..., target); None when it reads none. ``self_is_model``: the step is a method of the
    model (a LightningModule's ``training_step``), so ``self(x)`` calls it. ``outputs``: what the model returns on
    the batch's inputs, for a step that unpacks several outputs and compares each with a key of its own
    (``_element_target``). Raises KeysUnknown for a key whose use the step does not show (see the module's
    docstring)."""
    names = _batch_names(node, role_of)
    if not names:
        return None
    keys: dict[str, None] = {}
    for item in ast.walk(node):
        if isinstance(item, ast.Subscript) and isinstance(item.value, ast.Name) and item.value.id in names \
                and isinstance(item.slice, ast.Constant) and isinstance(item.slice.value, str):
            keys.setdefault(item.slice.value)
    if not keys:
        return None
    aliases: dict[str, str] = {}

    def key_of(expression: ast.AST) -> Optional[str]:
        while isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute) \
                and expression.func.attr in _SAME_DATA:
            expression = expression.func.value
        if isinstance(expression, ast.Subscript) and isinstance(expression.value, ast.Name) \
                and expression.value.id in names and isinstance(expression.slice, ast.Constant):
            return expression.slice.value if isinstance(expression.slice.value, str) else None
        if isinstance(expression, ast.Name):
            return aliases.get(expression.id)
        return None

    assignments = [n for n in ast.walk(node) if isinstance(n, ast.Assign) and len(n.targets) == 1]
    for _ in range(2):  # ``x = batch["x"]; x = x.to(device)``
        for assign in assignments:
            target, value = assign.targets[0], assign.value
            pairs = list(zip(target.elts, value.elts)) if isinstance(target, ast.Tuple) \
                and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts) else [(target, value)]
            for name, expression in pairs:
                key = key_of(expression)
                if isinstance(name, ast.Name) and key is not None:
                    aliases[name.id] = key

    def is_model_call(call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        func = call.func.value if isinstance(call.func, ast.Attribute) and call.func.attr == "forward" else call.func
        return isinstance(func, ast.Name) and (role_of(func.id) == "model" or self_is_model and func.id == "self") \
            or isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
            and role_of(func.attr) == "model"

    def base(expression: ast.AST) -> ast.AST:
        while isinstance(expression, (ast.Subscript, ast.Attribute)):
            expression = expression.value
        return expression

    inputs, target = batch[:-1], batch[-1]
    found: dict[str, torch.Tensor] = {}
    named: set[str] = set()  # names of the model's output
    elements: dict[str, int] = {}  # names of one of its outputs, by position (``a, b = model(x)``)
    for item in ast.walk(node):
        if is_model_call(item):
            if any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id in names for k in item.keywords):
                raise KeysUnknown("the step passes its batch to the model as keywords (model(**batch)): the "
                                  "names the model takes are not keys the runner can fill")
            for position, argument in enumerate(item.args[:len(inputs)]):
                key = key_of(argument)
                if key is not None:
                    found.setdefault(key, inputs[position])
        if isinstance(item, ast.Assign) and is_model_call(base(item.value)):
            named.update(t.id for t in item.targets if isinstance(t, ast.Name))
            if isinstance(item.value, ast.Call) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Tuple):
                elements.update({t.id: i for i, t in enumerate(item.targets[0].elts) if isinstance(t, ast.Name)})
    returned: list = []  # the model's outputs, computed once where a key is compared with one of several
    for item in ast.walk(node):
        if isinstance(item, ast.Call) and not is_model_call(item) and len(item.args) >= 2:
            first = base(item.args[0])
            key = key_of(item.args[1])
            if key is None:
                continue
            if is_model_call(first) or isinstance(first, ast.Name) and first.id in named:
                found.setdefault(key, target)
                continue
            compared = item.args[0]
            first = compared.func.value if isinstance(compared, ast.Call) \
                and isinstance(compared.func, ast.Attribute) else compared
            if isinstance(first, ast.Name) and first.id in elements and outputs is not None and key not in found:
                if not returned:
                    returned.append(outputs())
                values = returned[0]
                index = elements[first.id]
                if isinstance(values, (tuple, list)) and index < len(values):
                    element = _element_target(values[index], item.args[0])
                    if element is not None:
                        found[key] = element
    for key, value in found.items():
        if value is target and target.is_floating_point() and any(
                _casts_to_integer(item) and key_of(item.func.value) == key for item in ast.walk(node)):
            found[key] = class_indices(target)
    unknown = [k for k in keys if k not in found]
    if unknown:
        raise KeysUnknown(f"the step reads its batch by keys, and {', '.join(repr(k) for k in unknown)} is neither "
                          "passed to the model nor compared with its output: the runner cannot tell what it holds")
    return {key: found[key] for key in keys}


class KeyedDataset(torch.utils.data.Dataset):
    """Rows of ``columns`` as dicts (``{key: row}``), repeated ``copies`` times; a DataLoader collates them into a
    dict batch. On the CPU, as a real data set's rows are (the step moves them; pinned memory holds CPU tensors)."""

    def __init__(self, columns: dict, copies: int):
        self.columns = {k: torch.cat([v] * copies).cpu() for k, v in columns.items()}
        self.rows = len(next(iter(self.columns.values())))

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict:
        return {k: v[index] for k, v in self.columns.items()}
