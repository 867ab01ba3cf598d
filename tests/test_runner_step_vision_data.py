"""A training script that reads an image classification set through torchvision, on a runner without torchvision
(issue 27, item 4): the set, its transforms and the image helpers stand in on synthetic images of the set's
documented size, so the script's own loop runs and is checked; a planted missing ``zero_grad()`` still fails at
its line; what the stand-in does not cover (another kind of data set, a torchvision model) stays a skip naming
the package."""
from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from gpu_runner import vision_data  # noqa: E402
from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import assert_zero_grad_fails_at, checks  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                                reason="torchvision is installed: the stand-in is not used")

# Colour thumbnails, ten kinds, a small convolutional classifier; the data set and its augmentation from torchvision.
THUMBNAILS = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms
    from torchvision.utils import save_image


    class Thumbnails(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Conv2d(3, 6, 3, padding=1)
            self.head = nn.Linear(6 * 16 * 16, 10)

        def forward(self, x):
            return self.head(F.max_pool2d(self.features(x).relu(), 2).flatten(1))


    def fit(rounds=40, device="cpu"):
        augment = transforms.Compose([
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
        ])
        pictures = datasets.CIFAR10("./pictures", train=True, download=True, transform=augment)
        batches = DataLoader(pictures, batch_size=256, shuffle=True, num_workers=4)
        classifier = Thumbnails().to(device)
        opt = torch.optim.SGD(classifier.parameters(), lr=0.05)
        for round_ in range(rounds):
            classifier.train()
            for images, kinds in batches:
                opt.zero_grad()
                loss = F.cross_entropy(classifier(images.to(device)), kinds.to(device))
                loss.backward()
                opt.step()
            save_image(images[:4], f"round{round_}.png")


    if __name__ == "__main__":
        fit()
'''


def test_a_script_on_a_torchvision_data_set_runs_on_synthetic_images(tmp_path):
    root = write_tree(tmp_path, {"fit.py": THUMBNAILS})
    report = smoke_step(root, "fit.py:fit", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"
    notes = " ".join(report["notes"])
    assert "data set (CIFAR10) gave synthetic images" in notes and "RandomCrop" in notes
    assert "batches of 8" in notes


def test_a_planted_missing_zero_grad_fails_at_its_line_on_synthetic_images(tmp_path):
    root = write_tree(tmp_path, {"fit.py": THUMBNAILS.replace("                opt.zero_grad()\n", "")})
    report = smoke_step(root, "fit.py:fit", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "fit.py", "opt.step()")


def test_a_data_set_outside_the_classification_table_is_still_the_missing_package(tmp_path):
    source = THUMBNAILS.replace('datasets.CIFAR10("./pictures", train=True, download=True, transform=augment)',
                                'datasets.VOCSegmentation("./pictures", transform=augment)')
    report = smoke_step(write_tree(tmp_path, {"fit.py": source}), "fit.py:fit", None, device="cpu")
    assert report["status"] == "skipped" and "'torchvision'" in report["reason"], report


def test_a_torchvision_model_is_still_the_missing_package(tmp_path):
    source = THUMBNAILS.replace("from torchvision.utils import save_image",
                                "from torchvision.utils import save_image\n    from torchvision import models") \
        .replace("classifier = Thumbnails().to(device)", "classifier = models.resnet18(num_classes=10).to(device)")
    report = smoke_step(write_tree(tmp_path, {"fit.py": source}), "fit.py:fit", None, device="cpu")
    assert report["status"] == "skipped" and "'torchvision'" in report["reason"], report


def test_the_transforms_give_the_shapes_torchvision_documents():
    image = torch.rand(3, 40, 60)
    assert vision_data.Resize(20)(image).shape == (3, 20, 30)
    assert vision_data.Resize((16, 16))(image).shape == (3, 16, 16)
    assert vision_data.CenterCrop(24)(image).shape == (3, 24, 24)
    assert vision_data.RandomCrop(32, padding=4)(torch.rand(3, 32, 32)).shape == (3, 32, 32)
    assert vision_data.Grayscale(3)(image).shape == (3, 40, 60)
    normalized = vision_data.Normalize((0.5,) * 3, (0.5,) * 3)(torch.full((3, 2, 2), 0.5))
    assert torch.equal(normalized, torch.zeros(3, 2, 2))
    pictures = vision_data.substitutes()["torchvision.datasets.MNIST"]("./data", transform=vision_data.ToTensor())
    picture, label = pictures[3]
    assert picture.shape == (1, 28, 28) and 0 <= label < 10 and torch.equal(pictures[3][0], picture)
