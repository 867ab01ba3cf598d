"""Two questions the program model answers for every rule: does a notebook's code run as several processes (it
does not: one kernel), and where does a data set take its items from (the CIFAR family, SVHN and USPS read their
whole array of images when built; a data set handed to a function, or returned by one, is what its callers hand in
or what the function builds)."""
from __future__ import annotations

import json

from analyzers.config import Config
from analyzers.engine import analyze_notebook_text, analyze_source

CONFIG = Config(preview=True, measured_severities=False)

DATA_PARALLEL_TRAINING = """\
import torch
import torch.nn as nn
model = nn.DataParallel(build_model()).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for images, labels in loader:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()
"""


def _notebook(*cells: str) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": cell}
        for cell in cells]})


def _rules(findings, rule):
    return [f for f in findings if f.rule == rule]


def test_data_parallel_in_a_training_script_is_reported():
    assert len(_rules(analyze_source(DATA_PARALLEL_TRAINING, "train.py", CONFIG).findings, "TR724")) == 1


def test_data_parallel_in_a_notebook_is_not_reported_one_kernel_cannot_be_one_process_per_gpu():
    notebook = _notebook("import torch\nimport torch.nn as nn\nmodel = nn.DataParallel(build_model()).cuda()",
                         "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor images, labels in loader:\n"
                         "    optimizer.zero_grad()\n"
                         "    nn.functional.cross_entropy(model(images), labels).backward()\n    optimizer.step()")
    assert _rules(analyze_notebook_text(notebook, "demo.ipynb", CONFIG).findings, "TR724") == []


def _loader_script(dataset: str, transform: str) -> str:
    return (f"import torch\nfrom torchvision import datasets, transforms\nfrom torch.utils.data import DataLoader\n"
            f"train_set = datasets.{dataset}('data', download=True, transform={transform})\n"
            f"train_loader = DataLoader(train_set, batch_size=128, shuffle=True)\n"
            f"model = build_model().cuda()\n"
            f"for x, y in train_loader:\n    x, y = x.cuda(), y.cuda()\n")


def test_image_sets_held_in_memory_need_no_workers_but_still_copy_an_image_per_item():
    for dataset in ("CIFAR10", "CIFAR100", "SVHN", "USPS"):
        findings = analyze_source(_loader_script(dataset, "transforms.ToTensor()"), "train.py", CONFIG).findings
        assert _rules(findings, "TR702") == [], dataset
        assert len(_rules(findings, "TR703")) == 1, dataset  # pinned memory speeds the copy of each image


def test_mnist_is_small_tensors_in_memory_no_workers_and_nothing_worth_pinning():
    findings = analyze_source(_loader_script("MNIST", "transforms.ToTensor()"), "train.py", CONFIG).findings
    assert _rules(findings, "TR702") == [] and _rules(findings, "TR703") == []


def test_random_augmentation_is_still_work_per_item():
    augmented = "transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.ToTensor()])"
    findings = analyze_source(_loader_script("CIFAR10", augmented), "train.py", CONFIG).findings
    assert len(_rules(findings, "TR702")) == 1


def test_an_image_folder_is_read_from_disk_per_item():
    findings = analyze_source(_loader_script("ImageFolder", "transforms.ToTensor()").replace("'data', download=True, ",
                                                                                            "'data', "),
                              "train.py", CONFIG).findings
    assert len(_rules(findings, "TR702")) == 1


FEATURES_SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
def load_examples(path, evaluate=False):
    features = torch.load(path)
    dataset = TensorDataset(features["ids"], features["labels"])
    return dataset
def train(args, train_dataset, model):
    train_loader = DataLoader(train_dataset, batch_size=32, shuffle=True)
    for ids, labels in train_loader:
        model(ids.cuda(), labels.cuda()).loss.backward()
def main(args):
    model = build_model().cuda()
    train_dataset = load_examples(args.features)
    train(args, train_dataset, model)
"""


def test_a_data_set_a_function_of_the_file_builds_in_memory_and_hands_to_train_is_in_memory():
    findings = analyze_source(FEATURES_SCRIPT, "run.py", CONFIG).findings
    assert _rules(findings, "TR702") == [] and _rules(findings, "TR703") == []


def test_one_caller_handing_in_data_read_from_disk_is_enough_to_report():
    from_disk = FEATURES_SCRIPT + "def other(args, model):\n    train(args, ImageFolder(args.root), model)\n"
    assert len(_rules(analyze_source(from_disk, "run.py", CONFIG).findings, "TR702")) == 1
    unknown = FEATURES_SCRIPT.replace("    return dataset", "    if evaluate:\n        return read_split(path)\n"
                                      "    return dataset")
    assert len(_rules(analyze_source(unknown, "run.py", CONFIG).findings, "TR702")) == 1
