# A pull request's model that goes after the sandbox's resource limits rather than its secrets (the red team's
# growsdown, /dev fill, socket family and process-holding attacks). tests/security/test_sandbox_resources.py
# fills in @@PARAMS@@; the class named by P["mode"] raises with what it got as JSON between RESOURCES<< >>.
import ctypes
import errno
import json
import mmap
import os
import resource
import socket
import time

import torch.nn as nn

P = json.loads(r'''@@PARAMS@@''')
libc = ctypes.CDLL(None, use_errno=True)
MAP_GROWSDOWN = 0x0100
CHUNK = 64 << 20


def growsdown():
    """Touch twice the memory budget in MAP_GROWSDOWN mappings (counted as stack, not as data)."""
    got, maps = 0, []
    while got < 2 * P["memory_bytes"]:
        try:
            m = mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_GROWSDOWN)
        except OSError as exc:
            return {"MiB": got >> 20, "stopped": errno.errorcode.get(exc.errno, "?")}
        for i in range(0, CHUNK, 4096):
            m[i] = 1
        maps.append(m)
        got += CHUNK
    return {"MiB": got >> 20, "stopped": None}


def fill(directory, total):
    written = 0
    try:
        with open(os.path.join(directory, "fill"), "wb") as f:
            while written < total:
                f.write(b"\xa5" * (1 << 20))
                written += 1 << 20
    except OSError as exc:
        return {"MiB": written >> 20, "stopped": errno.errorcode.get(exc.errno, "?")}
    return {"MiB": written >> 20, "stopped": None}


def socket_families():
    # (family, type, protocol): what the red team found open, and what Python and torch need
    families = {"AF_VSOCK": (40, 1, 0), "AF_PACKET": (17, 3, 0), "AF_ALG": (38, 5, 0), "AF_KEY": (15, 3, 2),
                "AF_TIPC": (30, 5, 0), "AF_RDS": (21, 5, 0), "AF_XDP": (44, 3, 0), "AF_BLUETOOTH": (31, 3, 1),
                "AF_CAN": (29, 3, 1), "AF_QIPCRTR": (42, 2, 0), "AF_SMC": (43, 1, 0), "AF_NETLINK_AUDIT": (16, 3, 9),
                "AF_NETLINK_UEVENT": (16, 2, 15), "family 60": (60, 1, 0),
                "AF_UNIX": (1, 1, 0), "AF_INET": (2, 1, 0), "AF_INET6": (10, 1, 0), "AF_NETLINK_ROUTE": (16, 3, 0)}
    out = {}
    for name, (family, kind, protocol) in families.items():
        fd = libc.socket(family, kind, protocol)
        out[name] = "open" if fd >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
        if fd >= 0:
            os.close(fd)
    pair = (ctypes.c_int * 2)()
    out["socketpair AF_VSOCK"] = ("open" if libc.socketpair(40, 1, 0, pair) == 0
                                  else errno.errorcode.get(ctypes.get_errno(), "?"))
    return out


def raise_stack():
    try:
        resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        return "raised"
    except (ValueError, OSError) as exc:
        return str(exc)


def hold_processes():
    """Fork up to the limit and hold the children for P["hold_s"] (a concurrent run must not notice)."""
    children = []
    try:
        while len(children) < 2 * P["processes"]:
            pid = os.fork()
            if pid == 0:
                time.sleep(P["hold_s"])
                os._exit(0)
            children.append(pid)
    except OSError as exc:
        stopped = errno.errorcode.get(exc.errno, "?")
    else:
        stopped = None
    time.sleep(P["hold_s"])
    return {"held": len(children), "stopped": stopped}


def open_files():
    """Socket pairs until the descriptor limit: each may queue kernel memory outside every other limit."""
    pairs = []
    try:
        while len(pairs) < 100_000:
            pairs.append(socket.socketpair())
    except OSError as exc:
        stopped = errno.errorcode.get(exc.errno, "?")
    else:
        stopped = None
    for a, b in pairs:
        a.close()
        b.close()
    return {"pairs": len(pairs), "stopped": stopped}


def training_needs():
    """What the allowed socket families are for: DataLoader workers (AF_UNIX, file descriptor passing) and
    torch.distributed's gloo on loopback (AF_INET, routing netlink for the interfaces)."""
    import torch
    import torch.distributed as dist

    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    batches = sum(1 for _ in torch.utils.data.DataLoader(data, batch_size=8, num_workers=2))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    try:
        dist.init_process_group("gloo", rank=0, world_size=1)
        total = torch.ones(2)
        dist.all_reduce(total)
        dist.destroy_process_group()
        gloo = total.tolist()
    except Exception as exc:  # noqa: BLE001 - reported, the test says what failed
        gloo = f"{type(exc).__name__}: {exc}"[:200]
    return {"dataloader_batches": batches, "gloo_all_reduce": gloo}


def report(results):
    raise RuntimeError("RESOURCES<<" + json.dumps(results) + ">>RESOURCES")


class Limits(nn.Module):
    def __init__(self):
        super().__init__()
        report({"growsdown": growsdown(), "dev": fill("/dev", 64 << 20), "sockets": socket_families(),
                "stack": raise_stack(), "files": open_files(), "needs": training_needs(), "uid": os.getuid()})


class Hog(nn.Module):
    def __init__(self):
        super().__init__()
        report({"processes": hold_processes()})
