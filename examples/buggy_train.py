"""A small image classifier with the bugs that quietly ruin real training runs.

Run `torchreview check examples/` to see them reported.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


class Classifier(nn.Module):
    def __init__(self, hidden=128, classes=10, extra_layers=[]):
        self.blocks = [nn.Linear(784, hidden), nn.Linear(hidden, hidden)]
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        for block in self.blocks:
            x = F.relu(block(x))
        mask = torch.ones(x.shape[0], 1)
        return F.softmax(self.head(x * mask), dim=1)


def evaluate(model, loader):
    correct = 0
    for images, labels in loader:
        logits = model(images.cuda())
        correct += (logits.argmax(1) == labels.cuda()).sum().item()
    return correct / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume")
    args = parser.parse_args()

    device = torch.device("cuda")
    model = Classifier().to(device)
    if args.resume:
        model.load_state_dict(torch.load(args.resume))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    criterion = nn.CrossEntropyLoss()
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=256)
    scaler = torch.cuda.amp.GradScaler()

    for epoch in range(10):
        total_loss = 0
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            with torch.cuda.amp.autocast():
                probs = model(images)
                loss = criterion(probs, labels)
            scaler.scale(loss).backward()
            scheduler.step()
            scaler.step(optimizer)
            scaler.update()
            total_loss += loss
            torch.cuda.empty_cache()
        print(epoch, total_loss / len(train_loader), loss.data[0], evaluate(model, val_loader))
    torch.save(model, "classifier.pt")


if __name__ == "__main__":
    main()
