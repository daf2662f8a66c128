"""Weights over a torch.distributed group, in SGLang's protocol: both ends of it, with no default process group.

    trainer (rank 0)                                    server (rank rank_offset)
    open_group(addr, port, 0, world, name)   <->   POST /init_weights_update_group {master_address, master_port,
                                                        rank_offset, world_size, group_name, backend}
    broadcast each bucket from rank 0        <->   POST /update_weights_from_distributed {names, dtypes, shapes,
                                                        group_name, flush_cache, abort_all_requests, weight_version}

The group is formed the way SGLang 0.5.23 (`init_custom_process_group`, server side) and AReaL (trainer side)
form theirs, so any of them can sit at either end: a `tcp://` rendezvous store on the master's port (rank 0
hosts it), wrapped in a store prefixed with the group name, handed to torch's own group factory
(`_new_process_group_helper`), which adds the `<group_name>/` and `<device>/` prefixes (`cpu/` for gloo,
`cuda/` for NCCL) and the backend's sequence-number handshake. Keys built any other way never meet theirs
(a hand-made `PrefixStore(name) -> ProcessGroupGloo` waits for keys SGLang never writes, then times out).
Neither side needs `torch.distributed.init_process_group`, and a trainer's own ranks stay separate.
Both calls block until every member joins or sends: servers run them in a worker thread, callers run both
ends concurrently. A process holds at most one open group per name (torch's registry is by name, as in
SGLang); `close_group` frees the name.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

DTYPES = {name: getattr(torch, name) for name in ("float32", "float16", "bfloat16", "float64")}


def _host(address: str) -> str:
    """An IPv6 host as AReaL sends it ("[::1]", URL form) or bare: the bare form TCPStore wants."""
    return address[1:-1] if address.startswith("[") and address.endswith("]") else address


def open_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str = "gloo",
    timeout_s: float = 300.0,
) -> dist.ProcessGroup:
    """Join (rank 0: host) the weight-update group `group_name` of `world_size` members; blocks until all join.

    Same store keys and handshake as SGLang's and AReaL's `init_custom_process_group`, so either can be the
    other end. Raises ValueError for a bad argument or a name already open in this process, and torch's
    DistStoreError when the other members do not join within `timeout_s`.
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a group of {world_size}")
    if not group_name:
        raise ValueError("group_name must be a non-empty string")
    if group_name in c10d._world.pg_names.values():
        raise ValueError(f"a weight-update group named {group_name!r} is already open in this process")
    timeout = timedelta(seconds=timeout_s)
    # what torch's tcp:// rendezvous builds for `init_method="tcp://host:port"`: rank 0 hosts, the rest connect
    store: dist.Store = dist.TCPStore(
        _host(master_address), int(master_port), world_size, is_master=rank == 0, timeout=timeout, multi_tenant=True
    )
    store = dist.PrefixStore(group_name, store)  # the caller's prefix, as SGLang and AReaL add it
    # torch's group factory: "<group_name>/" and "<device>/" prefixes, the backend and its sequence handshake;
    # `[]` ranks = a group of its own, not a subgroup of any default group
    group, _ = c10d._new_process_group_helper(  # GroupName: a NewType of str
        world_size,
        rank,
        [],
        dist.Backend(backend),
        store,
        group_name=group_name,  # type: ignore[arg-type]
        timeout=timeout,
    )
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}  # so dist.broadcast(group=...) works too
    return group


def close_group(group: dist.ProcessGroup) -> None:
    """Leave a group opened by `open_group` and free its name in this process (a trainer may form it again)."""
    if group in c10d._world.pg_map:
        dist.destroy_process_group(group)


def parse_dtype(name: str) -> torch.dtype:
    """ "bfloat16" or "torch.bfloat16" -> torch.bfloat16 (SGLang's callers send either)."""
    dtype = DTYPES.get(str(name).removeprefix("torch."))
    if dtype is None:
        raise ValueError(f"unsupported dtype {name!r}: expected one of {sorted(DTYPES)}")
    return dtype


def receive(
    group: dist.ProcessGroup,
    names: list[str],
    dtypes: list[str],
    shapes: list[list[int]],
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """One bucket broadcast from rank 0, tensor by tensor in `names` order (blocks until it has arrived)."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}")
    # every tensor is allocated before the first broadcast: a bad dtype or shape fails here, not mid-bucket
    out = {
        name: torch.empty([int(s) for s in shape], dtype=parse_dtype(dtype), device=device)
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True)
    }
    for tensor in out.values():
        group.broadcast(tensor, 0).wait()
    return out


def send(group: dist.ProcessGroup, tensors: list[torch.Tensor]) -> None:
    """Broadcast one bucket from rank 0 in order (the receivers were told names, dtypes and shapes)."""
    for tensor in tensors:
        group.broadcast(tensor.detach().contiguous(), 0).wait()
