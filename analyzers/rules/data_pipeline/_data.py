"""Data pipeline: random augmentation on evaluation data, counting batches by re-iterating a loader."""
from __future__ import annotations


DATALOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
