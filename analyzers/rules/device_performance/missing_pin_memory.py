"""TR703 missing-pin-memory: DataLoader without pin_memory=True while batches are copied to CUDA."""
from __future__ import annotations

import re

from analyzers.context import (FileContext, is_false, keyword_arg)
from analyzers.markdown import named
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Valid
from analyzers.program.devices import device_facts as _facts
from analyzers.program.data import Loader as _Loader
from analyzers.rules.device_performance._device import LoaderRule as _LoaderRule


class MissingPinMemory(_LoaderRule):
    id = "TR703"
    source_hint = re.compile(r"DataLoader")  # a DataLoader call
    slug = "missing-pin-memory"
    category = Category.DEVICE
    severity = Severity.LOW
    speed_only = True
    summary = "DataLoader without pin_memory=True while batches are copied to CUDA"
    what = """
        Flags a `DataLoader` without `pin_memory=True` (absent or `False`) in a script whose
        loop copies batches to the GPU (`batch.to(device)`, `x.cuda()`...). A data set the program
        model knows to hold small items in memory is skipped (`TensorDataset`, the MNIST family, a `Dataset`
        class of the repository whose `__getitem__` only indexes what it holds, or one of these handed in by
        every caller of the function or returned by a function of the file); a set of full images held in
        memory (CIFAR) still copies an image per item, and is not.
    """
    why = """
        Host-to-device copies from pageable memory go through an extra staging copy and cannot
        overlap with compute. Pinned (page-locked) batches copy faster, and with
        `.to(device, non_blocking=True)` the copy overlaps with the GPU work.
    """
    example = """
        loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
    """
    fix_example = """
        loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    """
    VALID = [
        # a data set class of the program that only indexes tensors it holds: nothing to read per item
        Valid("import torch\nfrom torch.utils.data import Dataset, DataLoader\nclass Tokens(Dataset):\n"
              "    def __init__(self, ids, labels):\n        self.ids = torch.tensor(ids)\n        self.labels = labels\n"
              "    def __getitem__(self, i):\n        return self.ids[i], torch.tensor(self.labels[i])\n"
              "    def __len__(self):\n        return len(self.labels)\n"
              "train_loader = DataLoader(Tokens(ids, labels), batch_size=32, shuffle=True, num_workers=2)\n"
              "for x, y in train_loader:\n    x = x.cuda()\n"),
        # in-memory data: MNIST with ToTensor only, a TensorDataset; and a (shuffled) test loader
        "import torch\nfrom torchvision import datasets, transforms\nfrom torch.utils.data import DataLoader\n"
        "train_ds = datasets.MNIST('data', train=True, transform=transforms.ToTensor())\n"
        "train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)\n"
        "test_loader = DataLoader(test_folder, batch_size=64, shuffle=True)\n"
        "for x, y in train_loader:\n    x = x.cuda()\n",
        "import torch\nfrom torch.utils.data import DataLoader\ndevice = torch.device('cuda')\n"
        "loader = DataLoader(ds, num_workers=4, pin_memory=True)\nfor x, y in loader:\n    x = x.to(device)\n",
        # batches never moved to CUDA in a loop (only the model)
        "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=4)\n"
        "model = model.cuda()\n",
        # CPU training
        "import torch\nfrom torch.utils.data import DataLoader\ndevice = torch.device('cpu')\n"
        "loader = DataLoader(ds, num_workers=4)\nfor x, y in loader:\n    x = x.to(device)\n",
        # decided at run time
        "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(ds, pin_memory=use_cuda)\n"
        "for x, y in loader:\n    x = x.cuda()\n",
    ]
    INVALID = [
        # its __getitem__ opens an image file per item
        Invalid("import torch\nfrom PIL import Image\nfrom torch.utils.data import Dataset, DataLoader\nclass Photos(Dataset):\n"
                "    def __init__(self, paths):\n        self.paths = paths\n"
                "    def __getitem__(self, i):\n        return Image.open(self.paths[i])\n"
                "    def __len__(self):\n        return len(self.paths)\n"
                "train_loader = DataLoader(Photos(paths), batch_size=32, shuffle=True, num_workers=2)\n"
                "for x in train_loader:\n    x = x.cuda()\n", line=11),
        Invalid("import torch\nfrom torch.utils.data import DataLoader\n"
                "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
                "train_loader = DataLoader(train_ds, batch_size=64, num_workers=4)\n"
                "for x, y in train_loader:\n    x, y = x.to(device), y.to(device)\n",
                line=4, message="train_loader"),
        Invalid("import torch\nfrom torch.utils import data\n"
                "train_loader = data.DataLoader(ds, num_workers=2, pin_memory=False)\n"
                "def train(model, args):\n    for batch in loader:\n"
                "        batch = {k: v.to(args.device) for k, v in batch.items()}\n",
                line=3, message="pin_memory=False"),
        Invalid("import torch\nfrom torch.utils.data import DataLoader\n"
                "loader = DataLoader(ds, num_workers=2)\nfor step, (x, y) in enumerate(loader):\n"
                "    out = model(x.cuda(non_blocking=True))\n",
                line=3),
    ]

    def wants(self, loader: _Loader) -> bool:
        if loader.in_memory:
            return False
        pin = keyword_arg(loader.call, "pin_memory")
        if pin is None:
            return len([a for a in loader.call.args if a.keyword is None]) < 8  # positional pin_memory
        return is_false(pin.value)

    def end_file(self, ctx: FileContext) -> None:
        facts = _facts(ctx)
        if not self.loaders or not facts.cuda_evidence or not facts.batch_moves:
            return
        for loader in self.loaders:
            if not loader.training and not facts.non_blocking:
                continue  # pinning pays on training loaders, or wherever non_blocking copies rely on it
            pin = keyword_arg(loader.call, "pin_memory")
            how = "`pin_memory=False`" if pin is not None else "no `pin_memory=True`"
            self.report(loader.call, f"{named('DataLoader', loader.label)} has {how} while its batches are copied to CUDA: "
                                     f"copies from pageable memory are slower and cannot overlap compute; pass "
                                     f"pin_memory=True and move batches with non_blocking=True")
