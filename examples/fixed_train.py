"""The classifier of buggy_train.py with its review addressed."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


class Classifier(nn.Module):
    def __init__(self, hidden=128, classes=10, extra_layers=None):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(784, hidden), nn.Linear(hidden, hidden)])
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        for block in self.blocks:
            x = F.relu(block(x))
        mask = torch.ones(x.shape[0], 1, device=x.device)
        return self.head(x * mask)  # logits: CrossEntropyLoss applies log_softmax itself


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct = 0
    for images, labels in loader:
        logits = model(images.to(device, non_blocking=True))
        correct += (logits.argmax(1) == labels.to(device)).sum().item()
    model.train()
    return correct / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = Classifier().to(device)
    if args.resume:
        model.load_state_dict(torch.load(args.resume, weights_only=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    criterion = nn.CrossEntropyLoss()
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=256, num_workers=4, pin_memory=True)
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(10):
        total_loss = 0.0
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.amp.autocast("cuda"):
                logits = model(images)
                loss = criterion(logits, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            total_loss += loss.item()
        scheduler.step()
        print(epoch, total_loss / len(train_loader), evaluate(model, val_loader, device))
    torch.save(model.state_dict(), "classifier.pt")


if __name__ == "__main__":
    main()
