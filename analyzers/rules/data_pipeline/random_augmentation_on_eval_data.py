"""TR960 random-augmentation-on-eval-data: Random augmentation applied to a validation/test dataset."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name, keyword_arg, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.data import evaluation_data_reason, random_transforms, transform_replaced
from analyzers.program.library import is_data_loader
from analyzers.program.names import last_segment, names_evaluation_data


_RANDOM_SPLIT = {"torch.utils.data.random_split", "torch.utils.data.dataset.random_split"}
_FOLDER_DATASETS = {"torchvision.datasets.ImageFolder", "torchvision.datasets.DatasetFolder",
                    "torchvision.datasets.folder.ImageFolder"}


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
        if is_data_loader(qualified):
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
        reason = evaluation_data_reason(node, ctx)
        if reason is None:
            return
        randoms = list(dict.fromkeys(random_transforms(value, ctx)))
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
        evaluation = next((n for n in names if n and names_evaluation_data(last_segment(n))), None)
        if evaluation is None:
            return
        dataset = argument(node, 0, "dataset")
        made = ctx.origin(dataset) if isinstance(dataset, (cst.Name, cst.Attribute)) else dataset
        if not isinstance(made, cst.Call):
            return
        transform = keyword_arg(made, "transform")
        value = transform.value if transform is not None else (
            argument(made, 1, "transform") if ctx.qualified_name(made.func) in _FOLDER_DATASETS else None)
        randoms = list(dict.fromkeys(random_transforms(value, ctx)))
        if not randoms or transform_replaced(evaluation, ctx):
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
        if not target or not names_evaluation_data(last_segment(target)):
            return
        dataset = argument(node, 0, "dataset")
        made = ctx.origin(dataset) if isinstance(dataset, (cst.Name, cst.Attribute)) else None
        if not isinstance(made, cst.Call) or evaluation_data_reason(made, ctx) is not None:
            return  # an evaluation dataset is reported where it is built
        transform = keyword_arg(made, "transform")
        randoms = list(dict.fromkeys(random_transforms(transform.value if transform is not None else None, ctx)))
        if not randoms:
            return
        shown = ", ".join(code_span(r) for r in randoms)
        self.report(node, f"{code_span(target)} evaluates on {code_span(short(ctx, dataset))}, built with random "
                          f"augmentation ({shown}) for training: the validation metric changes from run to run and "
                          f"is biased, and so is the checkpoint chosen by it; build the evaluation split from a "
                          f"dataset with a deterministic transform")
