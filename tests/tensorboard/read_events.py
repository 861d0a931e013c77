"""Reads a towers --logdir with TensorBoard's own event reader and prints a
JSON summary: scalar tags with their steps and values, and the graph's nodes
(name, op, device, inputs). Used by tests/cli.rs (logdir_is_read_by_tensorboard)."""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()
scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]}
graph = acc.Graph() if tags.get("graph") else None
nodes = [] if graph is None else [
    {"name": n.name, "op": n.op, "device": n.device, "input": list(n.input)} for n in graph.node
]
print(json.dumps({"scalars": scalars, "graph": tags.get("graph"), "nodes": nodes}))
