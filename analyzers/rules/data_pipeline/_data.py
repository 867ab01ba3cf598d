"""What TR960, TR961 and TR962 share."""
from __future__ import annotations


DATALOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
