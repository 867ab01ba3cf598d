"""torchvision's data API when torchvision is not installed: a training script's classification data set
(``CIFAR10(root, train=True, download=True, transform=tf)``), its transforms and its image-saving helpers, so that
the script's own loop runs on synthetic images instead of being skipped for the package (issue 27, item 4).

Only what torchvision documents, in the shapes it documents:

- a classification data set of the table below (or an image folder) gives ``(image, label)`` pairs: the image a
  float tensor ``[C, H, W]`` in ``[0, 1]`` of the data set's size (what ``ToTensor`` makes of its PIL images),
  the label an ``int`` below its class count; ``transform`` / ``target_transform`` are applied as torchvision
  applies them; a data set outside the table (detection, segmentation, video...) is still the missing package;
- transforms that change what the model sees (``Resize``, crops, ``Pad``, ``Normalize``, ``Grayscale``, flips,
  ``ToTensor``, ``Lambda``, ``Compose``...) do it on tensors; photometric and geometric augmentations that keep
  the shape (``ColorJitter``, ``RandomRotation``...) pass the image through; any other transform is still the
  missing package;
- ``utils.save_image`` writes nothing, ``utils.make_grid`` lays the images side by side.

Everything else of torchvision (``models``, ``ops``, ``io``) stays a stand-in that raises ``MissingPackageError``:
the step is skipped naming the package, as before. Used only while a script's step runs
(``script_steps._script_environment``), and said in the step's notes.
"""
from __future__ import annotations

import contextlib
import importlib.util
import random
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F

from gpu_runner import absent

PACKAGE = "torchvision"
SAMPLES = 4096  # items of a synthetic data set: more batches than a bounded step takes, made when read

# torchvision's classification data sets: (channels, height, width, classes), as its documentation gives them
DATASETS: dict[str, tuple[int, int, int, int]] = {
    "MNIST": (1, 28, 28, 10), "FashionMNIST": (1, 28, 28, 10), "KMNIST": (1, 28, 28, 10),
    "QMNIST": (1, 28, 28, 10), "EMNIST": (1, 28, 28, 10), "USPS": (1, 16, 16, 10),
    "CIFAR10": (3, 32, 32, 10), "CIFAR100": (3, 32, 32, 100), "SVHN": (3, 32, 32, 10), "STL10": (3, 96, 96, 10),
    "ImageFolder": (3, 64, 64, 10), "DatasetFolder": (3, 64, 64, 10),
}


class SyntheticImages(torch.utils.data.Dataset):
    """A classification data set of synthetic images, each made (seeded by its index) when read."""

    def __init__(self, name: str, shape: tuple[int, int, int, int], transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None):
        self.name, (self.channels, self.height, self.width, classes) = name, shape
        self.transform, self.target_transform = transform, target_transform
        self.classes = [f"class {i}" for i in range(classes)]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.targets = [i % classes for i in range(SAMPLES)]

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        if not 0 <= index < SAMPLES:
            raise IndexError(index)
        generator = torch.Generator().manual_seed(index)
        image = torch.rand(self.channels, self.height, self.width, generator=generator)
        label = self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label


def _data_set(name: str) -> Callable:
    def make(*args, transform=None, target_transform=None, **kwargs):
        return SyntheticImages(name, DATASETS[name], transform, target_transform)
    return make


# ---- transforms, on [C, H, W] (or [N, C, H, W]) tensors -----------------------------------------------------

def _pair(size: Any) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    size = tuple(size)
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])


def _resized(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    batched = image.dim() == 4
    out = F.interpolate((image if batched else image[None]).float(), size=size, mode="bilinear",
                        align_corners=False)
    return out if batched else out[0]


def _cropped(image: torch.Tensor, size: tuple[int, int], top: int, left: int) -> torch.Tensor:
    height, width = size
    pad_h, pad_w = max(height - image.shape[-2], 0), max(width - image.shape[-1], 0)
    if pad_h or pad_w:
        image = F.pad(image, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        top, left = min(top, image.shape[-2] - height), min(left, image.shape[-1] - width)
    return image[..., top:top + height, left:left + width]


def _padding(padding: Any) -> list[int]:
    if isinstance(padding, int):
        return [padding] * 4
    padding = list(padding)
    if len(padding) == 2:  # left/right, top/bottom
        return [padding[0], padding[0], padding[1], padding[1]]
    return [padding[0], padding[2], padding[1], padding[3]]  # left, top, right, bottom


class Compose:
    def __init__(self, transforms: Sequence[Callable]):
        self.transforms = list(transforms)

    def __call__(self, image):
        for transform in self.transforms:
            image = transform(image)
        return image


class ToTensor:
    def __call__(self, image):
        image = torch.as_tensor(image)
        return image.float() / 255 if not image.is_floating_point() else image


class PILToTensor:
    def __call__(self, image):
        image = torch.as_tensor(image)
        return (image * 255).to(torch.uint8) if image.is_floating_point() else image


class ConvertImageDtype:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __call__(self, image):
        return image.to(self.dtype)


class Normalize:
    def __init__(self, mean, std, inplace: bool = False):
        self.mean, self.std = torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)

    def __call__(self, image):
        return (image - self.mean.reshape(-1, 1, 1)) / self.std.reshape(-1, 1, 1)


class Resize:
    def __init__(self, size, *args, **kwargs):
        self.size = size

    def __call__(self, image):
        if isinstance(self.size, int) or len(tuple(self.size)) == 1:
            edge = self.size if isinstance(self.size, int) else tuple(self.size)[0]
            height, width = image.shape[-2:]
            size = (edge, max(1, round(width * edge / height))) if height <= width \
                else (max(1, round(height * edge / width)), edge)
        else:
            size = _pair(self.size)
        return _resized(image, size)


class CenterCrop:
    def __init__(self, size):
        self.size = _pair(size)

    def __call__(self, image):
        height, width = self.size
        return _cropped(image, self.size, max((image.shape[-2] - height) // 2, 0),
                        max((image.shape[-1] - width) // 2, 0))


class RandomCrop:
    def __init__(self, size, padding=None, pad_if_needed: bool = False, fill=0, padding_mode: str = "constant"):
        self.size, self.padding = _pair(size), padding

    def __call__(self, image):
        if self.padding:
            image = F.pad(image, _padding(self.padding))
        height, width = self.size
        top = random.randint(0, max(image.shape[-2] - height, 0))
        left = random.randint(0, max(image.shape[-1] - width, 0))
        return _cropped(image, self.size, top, left)


class RandomResizedCrop:
    def __init__(self, size, *args, **kwargs):
        self.size = _pair(size)

    def __call__(self, image):
        return _resized(image, self.size)


class Pad:
    def __init__(self, padding, fill=0, padding_mode: str = "constant"):
        self.padding = padding

    def __call__(self, image):
        return F.pad(image, _padding(self.padding))


class _Flip:
    dimension = -1

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, image):
        return image.flip(self.dimension) if random.random() < self.p else image


class RandomHorizontalFlip(_Flip):
    dimension = -1


class RandomVerticalFlip(_Flip):
    dimension = -2


class Grayscale:
    def __init__(self, num_output_channels: int = 1):
        self.channels = num_output_channels

    def __call__(self, image):
        gray = image.mean(dim=-3, keepdim=True)
        return gray.expand(*gray.shape[:-3], self.channels, *gray.shape[-2:]).clone()


class Lambda:
    def __init__(self, function: Callable):
        self.function = function

    def __call__(self, image):
        return self.function(image)


class RandomApply:
    def __init__(self, transforms, p: float = 0.5):
        self.transforms, self.p = list(transforms), p

    def __call__(self, image):
        if random.random() < self.p:
            for transform in self.transforms:
                image = transform(image)
        return image


class _KeepsShape:
    """An augmentation that keeps the image's shape and dtype (colour, blur, rotation, affine, perspective...): the
    image passes through, one of the draws the transform could make."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, image):
        return image


_SHAPE_KEEPING = ("ColorJitter", "RandomRotation", "RandomAffine", "RandomPerspective", "GaussianBlur",
                  "RandomGrayscale", "RandomErasing", "RandomInvert", "RandomPosterize", "RandomSolarize",
                  "RandomAdjustSharpness", "RandomAutocontrast", "RandomEqualize", "AutoAugment", "RandAugment",
                  "TrivialAugmentWide", "AugMix", "ToPILImage")

TRANSFORMS: dict[str, Callable] = {
    cls.__name__: cls for cls in (Compose, ToTensor, PILToTensor, ConvertImageDtype, Normalize, Resize, CenterCrop,
                                  RandomCrop, RandomResizedCrop, Pad, RandomHorizontalFlip, RandomVerticalFlip,
                                  Grayscale, Lambda, RandomApply)
}
TRANSFORMS.update({name: _KeepsShape for name in _SHAPE_KEEPING})
TRANSFORMS["Scale"] = Resize  # the old name


def make_grid(tensor, nrow: int = 8, padding: int = 2, *args, **kwargs):
    images = list(tensor) if torch.is_tensor(tensor) and tensor.dim() == 4 else list(tensor) \
        if isinstance(tensor, (list, tuple)) else [tensor]
    return torch.cat([image if image.dim() == 3 else image[None] for image in images], dim=-1)


def save_image(*args, **kwargs) -> None:
    return None


def substitutes() -> dict[str, Callable]:
    """What each of torchvision's names the step may call is on the runner (full dotted names)."""
    table: dict[str, Callable] = {}
    for name in DATASETS:
        table[f"{PACKAGE}.datasets.{name}"] = _data_set(name)
        table[f"{PACKAGE}.datasets.folder.{name}"] = _data_set(name)
    for name, value in TRANSFORMS.items():
        table[f"{PACKAGE}.transforms.{name}"] = value
        table[f"{PACKAGE}.transforms.transforms.{name}"] = value
    table[f"{PACKAGE}.utils.make_grid"] = make_grid
    table[f"{PACKAGE}.utils.save_image"] = save_image
    return table


@contextlib.contextmanager
def synthetic_vision_data(notes: list) -> Iterator[None]:
    """While a step runs: when torchvision is not installed, its data sets, transforms and image helpers are the
    ones above (imported in the step, or bound to stand-ins when its file was imported); each use is noted."""
    if importlib.util.find_spec(PACKAGE) is not None:
        yield
        return
    used: list[str] = []
    table = substitutes()

    def substitute(name: str) -> Optional[Callable]:
        found = table.get(name)
        if found is not None and name not in used:
            used.append(name)
        return found

    with absent.stand_ins([PACKAGE]), absent.substituted(substitute):
        try:
            yield
        finally:
            data = [n.rsplit(".", 1)[1] for n in used if ".datasets." in n]
            if used:
                notes.append("torchvision is not installed: the step's "
                             + (f"data set{'s' if len(data) > 1 else ''} ({', '.join(dict.fromkeys(data))}) gave "
                                f"synthetic images of the documented size and labels below the class count, and its "
                                if data else "")
                             + "transforms and image helpers ran on tensors (gpu_runner.vision_data): "
                             + ", ".join(dict.fromkeys(n.rsplit(".", 1)[1] for n in used if ".datasets." not in n)))
