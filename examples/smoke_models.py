"""Two small models for the GPU runner: one healthy, one whose bug no static check can see."""
import torch
import torch.nn as nn


class TabularNet(nn.Module):
    def __init__(self, in_features=16, hidden=32, num_classes=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


class AttentionPool(nn.Module):
    """Pools features with learned attention weights before classifying."""

    def __init__(self, in_features=16, hidden=32, num_classes=4):
        super().__init__()
        self.encoder = nn.Linear(in_features, hidden)
        self.score = nn.Linear(hidden, 1)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        h = torch.tanh(self.encoder(x))
        weights = torch.softmax(self.score(h), dim=0)  # normalizes across the batch: rows leak into each other
        return self.head(h * weights * x.shape[0])
