"""Data pipeline: random augmentation on evaluation data, counting batches by re-iterating a loader."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, is_false, is_true, keyword_arg, positional_args,
                               short, string_value)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.names import last_segment, name_words
from analyzers.rules.base import Invalid, Rule

_RANDOM_TRANSFORMS = {"ColorJitter", "RandAugment", "TrivialAugmentWide", "AutoAugment", "AugMix", "ElasticTransform",
                      "RandomApply", "RandomChoice", "RandomOrder"}
_TRANSFORM_ROOTS = ("torchvision.transforms", "torchvision.transforms.v2", "albumentations", "monai.transforms",
                    "timm.data")
_EVAL_WORD = re.compile(r"(^|_|\b)(val|valid|validation|test|testing|eval|evaluation|dev|holdout)(_|\b|$|set|data|"
                        r"dataset|loader|ds|dl)", re.IGNORECASE)
_EVAL_SPLITS = {"val", "valid", "validation", "test", "eval", "dev", "testing"}
_RANDOM_SPLIT = {"torch.utils.data.random_split", "torch.utils.data.dataset.random_split"}
_FOLDER_DATASETS = {"torchvision.datasets.ImageFolder", "torchvision.datasets.DatasetFolder",
                    "torchvision.datasets.folder.ImageFolder"}


def _random_transforms(expr: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> list[str]:
    """Names of the random transforms ``expr`` (a Compose, a list, or a name bound to one) applies."""
    if expr is None or depth > 3:
        return []
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return _random_transforms(ctx.assigned_value(expr), ctx, depth + 1)
    if isinstance(expr, (cst.List, cst.Tuple)):
        found: list[str] = []
        for element in expr.elements:
            found.extend(_random_transforms(element.value, ctx, depth + 1))
        return found
    if not isinstance(expr, cst.Call):
        return []
    qualified = ctx.qualified_name(expr.func) or ""
    last = qualified.rsplit(".", 1)[-1]
    if not qualified.startswith(_TRANSFORM_ROOTS):
        return []
    if last == "Compose":
        return _random_transforms(argument(expr, 0, "transforms"), ctx, depth + 1)
    if last.startswith("Random") or last in _RANDOM_TRANSFORMS:
        probability = keyword_arg(expr, "p")
        if probability is not None and isinstance(probability.value, (cst.Integer, cst.Float)) and \
                float(probability.value.value) == 0.0:
            return []
        return [last]
    return []


def _evaluation_reason(node: cst.Call, ctx: FileContext) -> Optional[str]:
    train = keyword_arg(node, "train")
    if train is not None and is_false(train.value):
        return "`train=False`"
    split = keyword_arg(node, "split")
    if split is not None and (string_value(split.value) or "").lower() in _EVAL_SPLITS:
        return f"`split={ctx.module.code_for_node(split.value)}`"
    parent = ctx.parent(node)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        target = dotted_name(parent.targets[0].target)
        if target and _EVAL_WORD.search(target.rsplit(".", 1)[-1]):
            return f"it is assigned to {code_span(target)}"
    return None


class RandomAugmentationOnEvalData(Rule):
    id = "TR960"
    source_hint = re.compile(r"Random|ColorJitter|Augment|AugMix|ElasticTransform")  # a random transform built in this file
    slug = "random-augmentation-on-eval-data"
    category = Category.DATA_PIPELINE
    severity = Severity.HIGH
    summary = "Random augmentation applied to a validation/test dataset"
    what = """
        Flags a dataset built for evaluation (`train=False`, `split="val"/"test"`, or assigned to
        a name like `test_data` / `val_set`) whose `transform=` applies random augmentation:
        `Random*` transforms, `ColorJitter`, `RandAugment`, `TrivialAugmentWide`, `AutoAugment`,
        `AugMix`, directly or through a `Compose` bound to a name. Also a validation/test
        DataLoader drawing from a training dataset built with such a transform
        (`valid_loader = DataLoader(train_data, sampler=valid_sampler)`), and a validation subset
        split off one with `random_split`.
    """
    why = """
        Evaluation must measure the model on the data as it is. Randomly flipped, rotated,
        cropped or color-jittered test images change on every pass: the reported accuracy is
        noisy from run to run and biased (usually low), and checkpoints are selected on that
        noise. It almost always means the training transform was reused for the test set.
    """
    example = """
        transform = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor()])
        train_data = datasets.CIFAR10("data", train=True, transform=transform)
        test_data = datasets.CIFAR10("data", train=False, transform=transform)
    """
    fix_example = """
        train_tf = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor()])
        test_tf = transforms.Compose([transforms.ToTensor()])
        train_data = datasets.CIFAR10("data", train=True, transform=train_tf)
        test_data = datasets.CIFAR10("data", train=False, transform=test_tf)
    """
    VALID = [
        """
        import torch
        from torchvision import datasets, transforms
        train_tf = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.ToTensor()])
        test_tf = transforms.Compose([transforms.ToTensor()])
        train_data = datasets.CIFAR10("data", train=True, transform=train_tf)
        test_data = datasets.CIFAR10("data", train=False, transform=test_tf)
        """,
        """
        import torch
        from torchvision import datasets, transforms
        tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()])
        val_set = datasets.ImageFolder("val", transform=tf)
        aug = transforms.RandomHorizontalFlip(p=0.0)
        test_set = datasets.ImageFolder("test", transform=aug)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torchvision import datasets, transforms
            transform = transforms.Compose([
                transforms.RandomHorizontalFlip(),
                transforms.RandomRotation(10),
                transforms.ToTensor(),
            ])
            train_data = datasets.CIFAR10("data", train=True, download=True, transform=transform)
            test_data = datasets.CIFAR10("data", train=False, download=True, transform=transform)
            """,
            line=10, message="`RandomHorizontalFlip`, `RandomRotation`",
        ),
        Invalid(
            """
            import torch
            import torchvision.transforms as T
            from torchvision.datasets import ImageFolder
            val_dataset = ImageFolder(val_dir, transform=T.Compose([T.RandomResizedCrop(224), T.ToTensor()]))
            """,
            line=5, message="`val_dataset`",
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, SubsetRandomSampler
            from torchvision import datasets, transforms
            train_transform = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor()])
            train_data = datasets.CIFAR10("data", train=True, transform=train_transform)
            train_loader = DataLoader(train_data, batch_size=20, sampler=SubsetRandomSampler(train_idx))
            valid_loader = DataLoader(train_data, batch_size=20, sampler=SubsetRandomSampler(valid_idx))
            """,
            line=8, message="`valid_loader` evaluates on `train_data`",
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import random_split
            from torchvision import datasets, transforms
            tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
            full = datasets.ImageFolder("data/train", transform=tf)
            train_ds, val_ds = random_split(full, [0.8, 0.2])
            """,
            line=7, message="`val_ds` is split off `full`",
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        qualified = ctx.qualified_name(node.func)
        if qualified in _DATALOADERS:
            self._loader(node, ctx)
            return
        if qualified in _RANDOM_SPLIT:
            self._random_split(node, ctx)
            return
        transform = keyword_arg(node, "transform")
        value = transform.value if transform is not None else None
        if value is None:
            if ctx.qualified_name(node.func) not in _FOLDER_DATASETS:
                return
            value = argument(node, 1, "transform")
            if value is None:
                return
        reason = _evaluation_reason(node, ctx)
        if reason is None:
            return
        randoms = list(dict.fromkeys(_random_transforms(value, ctx)))
        if not randoms:
            return
        shown = ", ".join(code_span(r) for r in randoms)
        via = f" through {code_span(short(ctx, value, 30))}" if isinstance(value, (cst.Name, cst.Attribute)) else ""
        self.report(node, f"{code_span(short(ctx, node))} is evaluation data ({reason}) but its transform{via} applies "
                          f"random augmentation ({shown}): the reported metric changes from run to run and is biased; "
                          f"give evaluation a deterministic transform (resize / center crop / ToTensor / Normalize)")

    def _random_split(self, node: cst.Call, ctx: FileContext) -> None:
        """``train_ds, val_ds = random_split(ImageFolder(root, transform=train_tf), ...)``: the validation subset
        keeps the training transform."""
        parent = ctx.parent(node)
        if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return
        target = parent.targets[0].target
        if not isinstance(target, (cst.Tuple, cst.List)):
            return
        names = [dotted_name(e.value) or "" for e in target.elements]
        evaluation = next((n for n in names if n and _EVAL_WORD.search(n.rsplit(".", 1)[-1])), None)
        if evaluation is None:
            return
        dataset = argument(node, 0, "dataset")
        made = ctx.origin(dataset) if isinstance(dataset, (cst.Name, cst.Attribute)) else dataset
        if not isinstance(made, cst.Call):
            return
        transform = keyword_arg(made, "transform")
        value = transform.value if transform is not None else (
            argument(made, 1, "transform") if ctx.qualified_name(made.func) in _FOLDER_DATASETS else None)
        randoms = list(dict.fromkeys(_random_transforms(value, ctx)))
        if not randoms:
            return
        shown = ", ".join(code_span(r) for r in randoms)
        self.report(node, f"{code_span(evaluation)} is split off {code_span(short(ctx, dataset, 40))}, whose transform "
                          f"applies random augmentation ({shown}): a `random_split` subset keeps its dataset's "
                          f"transform, so validation images are augmented and the metric is noisy and biased; build "
                          f"the validation subset over a dataset with a deterministic transform (e.g. `Subset` of a "
                          f"second dataset object with the same indices)")

    def _loader(self, node: cst.Call, ctx: FileContext) -> None:
        """``valid_loader = DataLoader(train_data, sampler=valid_sampler)`` over an augmented training set."""
        parent = ctx.parent(node)
        if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return
        target = dotted_name(parent.targets[0].target)
        if not target or not _EVAL_WORD.search(target.rsplit(".", 1)[-1]):
            return
        dataset = argument(node, 0, "dataset")
        made = ctx.origin(dataset) if isinstance(dataset, (cst.Name, cst.Attribute)) else None
        if not isinstance(made, cst.Call) or _evaluation_reason(made, ctx) is not None:
            return  # an evaluation dataset is reported where it is built
        transform = keyword_arg(made, "transform")
        randoms = list(dict.fromkeys(_random_transforms(transform.value if transform is not None else None, ctx)))
        if not randoms:
            return
        shown = ", ".join(code_span(r) for r in randoms)
        self.report(node, f"{code_span(target)} evaluates on {code_span(short(ctx, dataset))}, built with random "
                          f"augmentation ({shown}) for training: the validation metric changes from run to run and "
                          f"is biased, and so is the checkpoint chosen by it; build the evaluation split from a "
                          f"dataset with a deterministic transform")


# ---------------------------------------------------------------------------------------------
# TR961

_DATALOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}


def _is_loader(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    name = dotted_name(expr)
    if name is None:
        return False
    if ctx.origin_call_name(expr) in _DATALOADERS:
        return True
    last = name.rsplit(".", 1)[-1].lower()
    return last.endswith(("loader", "_dl")) or last in ("dl", "dataloader")


class CountBatchesByIterating(Rule):
    id = "TR961"
    slug = "count-batches-by-iterating"
    category = Category.DATA_PIPELINE
    severity = Severity.MEDIUM
    summary = "len(list(loader)) / sum(1 for _ in loader) runs the whole data pipeline to count batches"
    what = """
        Flags `len(list(loader))`, `len([b for b in loader])` and `sum(1 for _ in loader)` on a
        DataLoader.
    """
    why = """
        Each of these iterates the loader to the end: every sample is read from disk, decoded,
        augmented and collated (and `list` keeps the whole epoch in memory) only to produce a
        count. For a map-style dataset `len(loader)` answers at once; for a streaming pipeline,
        count the batches in the loop that already iterates them.
    """
    example = """
        for batch in train_dl:
            losses += train_step(batch)
        return losses / len(list(train_dl))
    """
    fix_example = """
        batches = 0
        for batch in train_dl:
            losses += train_step(batch)
            batches += 1
        return losses / batches  # or len(train_dl) for a map-style dataset
    """
    VALID = [
        """
        import torch
        n = len(train_loader)
        layers = len(list(model.parameters()))
        """,
        """
        import torch
        files = sum(1 for _ in folder.iterdir())
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def train_epoch(model, train_dl):
                losses = 0
                for src, tgt in train_dl:
                    losses += step(model, src, tgt)
                return losses / len(list(train_dl))
            """,
            line=7, message="`len(list(train_dl))`",
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            batches = DataLoader(ds, batch_size=32)
            steps = sum(1 for _ in batches)
            """,
            line=5,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not isinstance(func, cst.Name) or func.value not in ("len", "sum") or len(node.args) != 1:
            return
        if ctx.binding(func.value) is not None:
            return
        inner = node.args[0].value
        iterated: Optional[cst.BaseExpression] = None
        if func.value == "len":
            if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name) and inner.func.value in (
                    "list", "tuple") and len(inner.args) == 1:
                iterated = inner.args[0].value
            elif isinstance(inner, cst.ListComp) and inner.for_in.inner_for_in is None and not inner.for_in.ifs:
                iterated = inner.for_in.iter
        elif isinstance(inner, cst.GeneratorExp) and isinstance(inner.elt, cst.Integer) and inner.elt.value == "1" \
                and inner.for_in.inner_for_in is None and not inner.for_in.ifs:
            iterated = inner.for_in.iter
        if iterated is None or not _is_loader(iterated, ctx):
            return
        loader = short(ctx, iterated)
        self.report(node, f"{code_span(short(ctx, node))} iterates {code_span(loader)} to the end, loading and "
                          f"collating every batch, just to count them; use {code_span(f'len({loader})')} (map-style "
                          f"datasets) or count the batches in the loop that already iterates them")


# ---------------------------------------------------------------------------------------------
# scikit-learn: TR970, TR971

_TEST_WORDS = {"test", "testing", "holdout"}
_VAL_WORDS = {"val", "valid", "validation", "dev"}
_SPLIT = {"sklearn.model_selection.train_test_split", "sklearn.cross_validation.train_test_split"}
_CONCATS = {"pandas.concat", "numpy.concatenate", "numpy.vstack", "numpy.row_stack", "torch.cat", "torch.vstack"}
_ESTIMATORS = ("sklearn.", "xgboost.", "lightgbm.", "catboost.")
_PREPROCESSING = ("sklearn.preprocessing.", "sklearn.feature_extraction.", "sklearn.decomposition.", "sklearn.impute.",
                  "sklearn.feature_selection.")


def _name_tokens(name: str) -> set[str]:
    tokens = set(name_words(last_segment(name)))
    for token in list(tokens):
        if token[:1] in ("x", "y") and len(token) > 1:
            tokens.add(token[1:])  # Xtest, yval
        for suffix in ("set", "data", "df", "ds"):
            if token.endswith(suffix) and len(token) > len(suffix):
                tokens.add(token[: -len(suffix)])  # testset, valdata
    return tokens


def _mentions_test(expr: Optional[cst.BaseExpression]) -> Optional[str]:
    """The first name under ``expr`` that reads as test data (``X_test``, ``testset``), if any."""
    if expr is None:
        return None
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted_name(node)
            if name is not None:
                if _name_tokens(name) & _TEST_WORDS:
                    return name
                continue
        stack.extend(reversed(node.children))
    return None


def _targets(node: cst.CSTNode) -> list[str]:
    names = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            names.append(current.value)
        elif isinstance(current, (cst.Tuple, cst.List)):
            stack.extend(reversed([e.value for e in current.elements]))
    return names


class _Loop:
    def __init__(self, node: cst.For) -> None:
        self.node = node
        self.variables = set(_targets(node.target))
        self.fits = False
        self.varies = False
        self.evaluations: list[tuple[cst.Call, Optional[str], str]] = []  # call, assigned name, test data name
        self.compared: set[str] = set()
        self.compared_calls: list[cst.Call] = []
        self.appended: dict[str, list[cst.Call]] = {}  # list name -> evaluation calls appended to it


class TestSetModelSelection(Rule):
    id = "TR970"
    slug = "model-selection-on-test-set"
    category = Category.DATA_LEAKAGE
    severity = Severity.HIGH
    requires = "sklearn"
    summary = "Hyperparameters chosen by their score on the test set"
    what = """
        Flags a loop over hyperparameter values that builds an estimator from the loop
        variable, fits it, scores it on test data (`model.score(X_test, y_test)`,
        `accuracy_score(y_test, model.predict(X_test))`) and keeps the best: an `if` comparing
        the score, or a list of scores whose `max` / `argmax` is taken after the loop.
    """
    why = """
        Choosing among candidates by their test score fits the choice to the test set: the
        winning score is the maximum of noisy estimates and overstates how the model does on
        new data, and no untouched data is left to measure it. Select on a validation split or
        with cross-validation (`GridSearchCV`), then score the chosen model on the test set once.
    """
    example = """
        for k in range(1, 30):
            knn = KNeighborsClassifier(n_neighbors=k).fit(X_train, y_train)
            score = knn.score(X_test, y_test)
            if score > best_score:
                best_score, best_k = score, k
    """
    fix_example = """
        search = GridSearchCV(KNeighborsClassifier(), {"n_neighbors": range(1, 30)}, cv=5)
        search.fit(X_train, y_train)
        test_score = search.score(X_test, y_test)  # once, for the chosen model
    """
    VALID = [
        # selection on a validation split
        """
        from sklearn.neighbors import KNeighborsClassifier
        for k in range(1, 30):
            knn = KNeighborsClassifier(n_neighbors=k).fit(X_train, y_train)
            score = knn.score(X_val, y_val)
            if score > best_score:
                best_score, best_k = score, k
        """,
        # comparing models on the test set without choosing among them
        """
        from sklearn.linear_model import LogisticRegression
        for name, model in models.items():
            model.fit(X_train, y_train)
            print(name, model.score(X_test, y_test))
        """,
    ]
    INVALID = [
        Invalid(
            """
            from sklearn.neighbors import KNeighborsClassifier
            best_score = 0
            for k in range(1, 30):
                knn = KNeighborsClassifier(n_neighbors=k)
                knn.fit(X_train, y_train)
                score = knn.score(X_test, y_test)
                if score > best_score:
                    best_score, best_k = score, k
            """,
            line=7, message="`knn.score(X_test, y_test)`",
        ),
        Invalid(
            """
            import numpy as np
            from sklearn.svm import SVC
            from sklearn.metrics import accuracy_score
            scores = []
            for C in [0.01, 0.1, 1, 10]:
                clf = SVC(C=C).fit(X_train, y_train)
                scores.append(accuracy_score(y_test, clf.predict(X_test)))
            best_C = [0.01, 0.1, 1, 10][int(np.argmax(scores))]
            """,
            line=8, message="`C`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._loops: dict[cst.For, _Loop] = {}
        self._maxed: set[str] = set()  # lists whose max / argmax is taken

    def _active(self, ctx: FileContext) -> list[_Loop]:
        return [self._loops[lp] for lp in ctx.loops_in_function() if lp in self._loops]

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        self._loops[node] = _Loop(node)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if name in ("max", "argmax", "nanargmax", "idxmax", "sorted", "index"):
            for arg in node.args:
                target = dotted_name(arg.value)
                if target:
                    self._maxed.add(target)
            if isinstance(func, cst.Attribute):
                receiver = dotted_name(func.value)
                if receiver:
                    self._maxed.add(receiver)
        loops = self._active(ctx)
        if not loops:
            return
        qualified = ctx.qualified_name(func) or ""
        if name in ("fit", "fit_predict", "fit_transform"):
            for loop in loops:
                loop.fits = True
        if name == "set_params" or (qualified.startswith(("sklearn.", "xgboost.", "lightgbm.", "catboost."))
                                    and qualified.rsplit(".", 1)[-1][:1].isupper()):
            for loop in loops:
                used = {n.value for a in node.args for n in _walk_names(a.value)}
                if used & loop.variables:
                    loop.varies = True
        test = None
        if name == "score" and isinstance(func, cst.Attribute) and node.args:
            test = _mentions_test(node.args[0].value)
        elif qualified.startswith("sklearn.metrics.") and node.args:
            test = _mentions_test(node.args[0].value) or (
                _mentions_test(node.args[1].value) if len(node.args) > 1 else None)
        if test is not None:
            parent = ctx.parent(ctx.parent(node)) if isinstance(ctx.parent(node), cst.Arg) else ctx.parent(node)
            assigned = None
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                assigned = dotted_name(parent.targets[0].target)
            for loop in loops:
                loop.evaluations.append((node, assigned, test))
            if isinstance(parent, cst.Call) and isinstance(parent.func, cst.Attribute) and \
                    parent.func.attr.value == "append":
                container = dotted_name(parent.func.value)
                if container:
                    for loop in loops:
                        loop.appended.setdefault(container, []).append(node)

    def visit_Comparison(self, node: cst.Comparison, ctx: FileContext) -> None:
        loops = self._active(ctx)
        if not loops:
            return
        names = {dotted_name(n) for n in _walk_names(node)}
        for loop in loops:
            loop.compared |= {n for n in names if n}

    def end_file(self, ctx: FileContext) -> None:
        reported: set[cst.Call] = set()
        for loop in self._loops.values():
            if not (loop.fits and loop.varies and loop.evaluations):
                continue
            chosen = None
            for call, assigned, test in loop.evaluations:
                if assigned is not None and assigned in loop.compared:
                    chosen = (call, test)
                    break
            if chosen is None:
                for container, calls in loop.appended.items():
                    if container in self._maxed:
                        chosen = (calls[0], _mentions_test(calls[0]) or "the test set")
                        break
            if chosen is None or chosen[0] in reported:
                continue
            call, test = chosen
            reported.add(call)
            variables = ", ".join(code_span(v) for v in sorted(loop.variables))
            self.report(call, f"{code_span(short(ctx, call))} scores each candidate {variables} on {code_span(test)} and "
                              f"the loop keeps the best: the hyperparameter is chosen on the test set, so the test "
                              f"score overstates performance on new data; choose on a validation split or with "
                              f"cross-validation (GridSearchCV) and score the test set once")


def _walk_names(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (cst.Name, cst.Attribute)) and dotted_name(current) is not None:
            yield current
            continue
        stack.extend(current.children)


class TrainTestOverlap(Rule):
    id = "TR971"
    slug = "train-test-overlap"
    category = Category.DATA_LEAKAGE
    severity = Severity.HIGH
    requires = "sklearn"
    summary = "A model fit on test data, on train + test concatenated, or tuned on a split overlapping the test set"
    what = """
        Flags a second `train_test_split` of the same data that carves out a validation set
        (`X_val`) after a first split already took the test set from it, an estimator `fit` on
        training and test data concatenated back together
        (`model.fit(pd.concat([X_train, X_test]), ...)`), and a scikit-learn / XGBoost / LightGBM
        estimator fit on test data (`clf.fit(X_test, y_test)`; preprocessors are TR951's).
    """
    why = """
        Splitting the full data again draws the validation rows from everything, test rows
        included: the model is tuned on the test set. Fitting on train + test trains on the
        test rows outright. Either way the test score no longer measures generalization.
    """
    example = """
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
        X_tr, X_val, y_tr, y_val = train_test_split(X, y, test_size=0.2)
    """
    fix_example = """
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
        X_tr, X_val, y_tr, y_val = train_test_split(X_train, y_train, test_size=0.25)
    """
    VALID = [
        """
        from sklearn.model_selection import train_test_split
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
        X_tr, X_val, y_tr, y_val = train_test_split(X_train, y_train, test_size=0.25)
        """,
        """
        import pandas as pd
        from sklearn.linear_model import LogisticRegression
        model = LogisticRegression().fit(pd.concat([X_train, X_val]), y)
        """,
        # a scaler on test data is TR951's; a search object is fit on training data
        """
        from sklearn.preprocessing import StandardScaler
        from sklearn.linear_model import LogisticRegression
        scaler = StandardScaler()
        scaler.fit(X_test)
        clf = LogisticRegression()
        clf.fit(X_train, y_train)
        """,
    ]
    INVALID = [
        Invalid(
            """
            from sklearn.model_selection import train_test_split
            X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=0)
            X_tr, X_val, y_tr, y_val = train_test_split(X, y, test_size=0.2, random_state=1)
            """,
            line=4, message="splits `X` again",
        ),
        Invalid(
            """
            import pandas as pd
            from sklearn.ensemble import RandomForestClassifier
            full = pd.concat([X_train, X_test])
            clf = RandomForestClassifier().fit(full, pd.concat([y_train, y_test]))
            """,
            line=5, message="`X_test`",
        ),
        Invalid(
            """
            from sklearn.linear_model import LogisticRegression
            clf = LogisticRegression(max_iter=1000)
            clf.fit(X_test, y_test)
            print(clf.score(X_test, y_test))
            """,
            line=4, message="trains `LogisticRegression` on `X_test`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        # data name -> first split, its test part, the binding of the data name it split
        self._splits: dict[str, tuple[cst.Call, str, object]] = {}

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if name == "train_test_split" and ctx.qualified_name(func) in _SPLIT:
            self._split(node, ctx)
        elif name == "fit" and isinstance(func, cst.Attribute) and node.args:
            self._fit(node, ctx)

    def _split(self, node: cst.Call, ctx: FileContext) -> None:
        data = dotted_name(argument(node, 0, "X"))
        parent = ctx.parent(node)
        if data is None or not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return
        outputs = _targets(parent.targets[0].target)
        if len(outputs) < 2:
            return
        held_out = outputs[1]
        tokens = _name_tokens(held_out)
        first = self._splits.get(data)
        if first is None:
            if tokens & _TEST_WORDS:
                self._splits[data] = (node, held_out, ctx.binding(data))
            return
        if tokens & _VAL_WORDS and ctx.binding(data) is first[2]:  # the same data: not reassigned in between
            self.report(node, f"{code_span(short(ctx, node))} splits {code_span(data)} again: {code_span(held_out)} is "
                              f"drawn from all of {code_span(data)}, rows of {code_span(first[1])} included, so "
                              f"tuning on it tunes on the test set; split the training part "
                              f"({code_span(outputs[0])} of the first split) instead")

    def _fit(self, node: cst.Call, ctx: FileContext) -> None:
        receiver = node.func.value
        made = ctx.origin_call_name(receiver) or (ctx.call_name(receiver) if isinstance(receiver, cst.Call) else "") or ""
        if made.startswith(_PREPROCESSING):
            return
        data = node.args[0].value
        if made.startswith(_ESTIMATORS) and made.rsplit(".", 1)[-1][:1].isupper() and \
                not made.startswith(("sklearn.model_selection.", "sklearn.pipeline.", "sklearn.compose.")):
            test = _mentions_test(data)
            if test is not None and "train" not in _name_tokens(test):
                self.report(node, f"{code_span(short(ctx, node))} trains {code_span(made.rsplit('.', 1)[-1])} on "
                                  f"{code_span(test)}: the model learns the test rows, so any score on them measures "
                                  f"memorization; fit on the training split")
                return
        value = ctx.origin(data) if isinstance(data, (cst.Name, cst.Attribute)) else data
        if not isinstance(value, cst.Call) or ctx.qualified_name(value.func) not in _CONCATS or not value.args:
            return
        parts = value.args[0].value
        if not isinstance(parts, (cst.List, cst.Tuple)):
            return
        names = [dotted_name(e.value) or "" for e in parts.elements]
        test = next((n for n in names if _name_tokens(n) & _TEST_WORDS), None)
        train = next((n for n in names if "train" in _name_tokens(n)), None)
        if test is None or train is None:
            return
        self.report(node, f"{code_span(short(ctx, node))} fits on {code_span(train)} and {code_span(test)} concatenated: "
                          f"the model trains on the test rows, and any score on {code_span(test)} afterwards is "
                          f"meaningless; fit on the training data only")


# ---------------------------------------------------------------------------------------------
# TR962

_BATCH_SAMPLER_EXCLUSIVE = ("batch_size", "shuffle", "sampler", "drop_last")


def _none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


class DataLoaderExclusiveOptions(Rule):  # TR721 (shuffle-with-sampler) was folded into it: an alias
    id = "TR962"
    slug = "dataloader-exclusive-options"
    category = Category.DATA_PIPELINE
    severity = Severity.HIGH
    summary = "DataLoader(shuffle=True, sampler=...) or batch_sampler= with batch options raises ValueError"
    what = """
        Flags `DataLoader` calls that pass `shuffle=True` together with a `sampler=`, or a
        `batch_sampler=` together with `batch_size`, `shuffle`, `sampler` or `drop_last`.
    """
    why = """
        These options are mutually exclusive: the constructor raises `ValueError: sampler
        option is mutually exclusive with shuffle` (or its `batch_sampler` variant) before the
        first batch. The usual case is adding a `DistributedSampler` to a loader that shuffled:
        the sampler shuffles itself (`DistributedSampler(shuffle=True)` and
        `sampler.set_epoch(epoch)`), so `shuffle=True` has to go.
    """
    example = """
        loader = DataLoader(ds, batch_size=64, shuffle=True, sampler=DistributedSampler(ds))
    """
    fix_example = """
        loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds))
    """
    VALID = [
        """
        import torch
        from torch.utils.data import DataLoader
        a = DataLoader(ds, batch_size=64, shuffle=True)
        b = DataLoader(ds, batch_size=64, sampler=sampler)
        c = DataLoader(ds, batch_size=64, shuffle=(sampler is None), sampler=sampler)
        d = DataLoader(ds, batch_sampler=bs, num_workers=4)
        e = DataLoader(ds, batch_size=64, shuffle=True, sampler=None)
        """,
        """
        import torch
        loader = make_loader(ds, shuffle=True, sampler=sampler)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(ds, batch_size=64, shuffle=True, sampler=DistributedSampler(ds))
            """,
            line=4, message="`shuffle=True`",
            fixed="""
            import torch
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds))
            """,
        ),
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=32, batch_sampler=GroupedBatchSampler(ds, 32))
            """,
            line=3, message="`batch_size`",
        ),
        Invalid(  # the sampler chosen by a condition: the single-GPU run never shows the error
            """
            import torch.utils.data as tud
            sampler = tud.distributed.DistributedSampler(ds) if args.distributed else None
            loader = tud.DataLoader(ds, shuffle=True, sampler=sampler, num_workers=4)
            """,
            line=4, message="`shuffle=True`",
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if last != "DataLoader" and "DataLoader" not in ctx.imports.names.get(last, ""):
            return
        if ctx.qualified_name(func) not in _DATALOADERS or any(a.star for a in node.args):
            return
        batch_sampler = keyword_arg(node, "batch_sampler")
        if batch_sampler is not None and not _none(batch_sampler.value):
            clashing = []
            for name in _BATCH_SAMPLER_EXCLUSIVE:
                arg = keyword_arg(node, name)
                if arg is None or _none(arg.value):
                    continue
                if name in ("shuffle", "drop_last") and is_false(arg.value):
                    continue
                if name == "batch_size" and isinstance(arg.value, cst.Integer) and arg.value.value == "1":
                    continue  # the default
                clashing.append(name)
            if len(positional_args(node)) > 1:
                clashing.append("batch_size")
            if clashing:
                shown = ", ".join(code_span(c) for c in dict.fromkeys(clashing))
                self.report(node, f"{code_span(short(ctx, node))} passes `batch_sampler=` with {shown}: the "
                                  f"constructor raises ValueError (the batch sampler decides batch size, order and "
                                  f"dropping); drop {shown}")
            return
        shuffle, sampler = keyword_arg(node, "shuffle"), keyword_arg(node, "sampler")
        if shuffle is None or sampler is None or not is_true(shuffle.value) or _none(sampler.value):
            return
        args = [a for a in node.args if a is not shuffle]
        args[-1] = args[-1].with_changes(comma=node.args[-1].comma if node.args[-1] is not shuffle else
                                         cst.MaybeSentinel.DEFAULT)
        replacement = node.with_changes(args=args)
        self.report(node, f"{code_span(short(ctx, node))} passes `shuffle=True` with `sampler=`: DataLoader raises "
                          f"`ValueError: sampler option is mutually exclusive with shuffle`; drop `shuffle=True` and "
                          f"let the sampler shuffle (e.g. `DistributedSampler(shuffle=True)` with `set_epoch`)",
                    replacement=replacement)
