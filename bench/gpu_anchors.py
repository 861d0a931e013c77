"""The GPU anchors: PyTorch and JAX training steps of towers' seed models on
one GPU, timed the way runtime/tests/cuda_backend.rs times towers' CUDA
backend (bench/gpu.sh runs both in one call on the device machine).

Models (towers' `ModelKind::Mlp` and `ModelKind::Convnet`, 28x28x1 inputs):
  mlp     784-256-256-10, ReLU, softmax cross-entropy
  convnet conv 5x5x12 SAME + ReLU, max-pool 2, conv 3x3x24 SAME + ReLU,
          max-pool 2, dense 100 + ReLU, dropout 0.25, dense 10
SGD lr 0.05. One step = copy a host batch to the GPU, the training step,
fetch the loss to the host (which synchronizes); median over 200 steps
after 20 warm-up.

Modes:
  torch eager   nn.Module, F.cross_entropy, torch.optim.SGD (foreach);
                cudnn.benchmark on
  torch graph   the same step captured whole as a CUDA graph
                (torch.cuda.graph, static input tensors) and replayed
  jax jit       one jitted step (parameters donated), dropout keyed by the
                step number

Prints one line per (framework, mode, model, batch): `ANCHOR ... median
X ms`. Needs torch and jax with CUDA (the device machine's image has both).
"""

import os
import statistics
import sys
import time

import numpy as np

WARM, STEPS, LR = 20, 200, 0.05
CASES = [("mlp", 256), ("mlp", 1024), ("convnet", 256), ("convnet", 1024)]
# ANCHOR_STEPS=N: N timed steps (after WARM) instead of 200 (bench/gpu_check.sh
# uses fewer, to keep its call within its time).
STEPS = int(os.environ.get("ANCHOR_STEPS", STEPS))


def batch(model, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=(n,)).astype(np.int32)
    return x, y


def report(fw, mode, model, n, times):
    med = statistics.median(times) * 1e3
    print(f"ANCHOR {fw} {mode} {model} batch {n}: median {med:.3f} ms per step "
          f"(min {min(times) * 1e3:.3f}, {len(times)} steps after {WARM})", flush=True)


def torch_anchors():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)

    def net(model):
        if model == "mlp":
            return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, 10))
        return nn.Sequential(nn.Conv2d(1, 12, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(12, 24, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(24 * 7 * 7, 100), nn.ReLU(), nn.Dropout(0.25), nn.Linear(100, 10))

    for model, n in CASES:
        hosts = [batch(model, n, s) for s in range(4)]
        hosts = [(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).pin_memory(),
                  torch.from_numpy(y.astype(np.int64)).pin_memory()) for x, y in hosts]
        for mode in ["eager", "graph"]:
            torch.manual_seed(0)
            m = net(model).to(dev)
            opt = torch.optim.SGD(m.parameters(), lr=LR)
            sx = torch.empty_like(hosts[0][0], device=dev)
            sy = torch.empty_like(hosts[0][1], device=dev)

            def step():
                opt.zero_grad(set_to_none=False)
                loss = F.cross_entropy(m(sx), sy)
                loss.backward()
                opt.step()
                return loss

            if mode == "graph":
                sx.copy_(hosts[0][0])
                sy.copy_(hosts[0][1])
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    static_loss = step()
            times = []
            for i in range(WARM + STEPS):
                x, y = hosts[i % 4]
                t = time.perf_counter()
                sx.copy_(x, non_blocking=True)
                sy.copy_(y, non_blocking=True)
                if mode == "graph":
                    g.replay()
                    loss = static_loss
                else:
                    loss = step()
                float(loss.item())
                if i >= WARM:
                    times.append(time.perf_counter() - t)
            report("torch", mode, model, n, times)


def jax_anchors():
    import jax
    import jax.numpy as jnp

    print(f"jax {jax.__version__} on {jax.devices()[0]}", flush=True)

    def init(model, key):
        def dense(k, i, o):
            return (jax.random.normal(k, (i, o)) * np.sqrt(2.0 / i), jnp.zeros((o,)))

        def conv(k, kh, ci, co):
            return (jax.random.normal(k, (kh, kh, ci, co)) * np.sqrt(2.0 / (kh * kh * ci)), jnp.zeros((co,)))

        ks = jax.random.split(key, 4)
        if model == "mlp":
            return [dense(ks[0], 784, 256), dense(ks[1], 256, 256), dense(ks[2], 256, 10)]
        return [conv(ks[0], 5, 1, 12), conv(ks[1], 3, 12, 24), dense(ks[2], 24 * 7 * 7, 100), dense(ks[3], 100, 10)]

    def forward(model, p, x, key):
        if model == "mlp":
            h = x.reshape(x.shape[0], -1)
            for w, b in p[:-1]:
                h = jax.nn.relu(h @ w + b)
            return h @ p[-1][0] + p[-1][1]
        h = x
        for w, b in p[:2]:
            h = jax.lax.conv_general_dilated(h, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            h = jax.nn.relu(h + b)
            h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")
        h = h.reshape(h.shape[0], -1)
        h = jax.nn.relu(h @ p[2][0] + p[2][1])
        keep = jax.random.bernoulli(key, 0.75, h.shape)
        h = jnp.where(keep, h / 0.75, 0.0)
        return h @ p[3][0] + p[3][1]

    for model, n in CASES:
        def loss_fn(p, x, y, key):
            logits = forward(model, p, x, key)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

        def train_step(p, x, y, step):
            key = jax.random.fold_in(jax.random.PRNGKey(0), step)
            loss, grads = jax.value_and_grad(loss_fn)(p, x, y, key)
            return jax.tree_util.tree_map(lambda a, g: a - LR * g, p, grads), loss

        step_fn = jax.jit(train_step, donate_argnums=0)
        p = init(model, jax.random.PRNGKey(1))
        hosts = [batch(model, n, s) for s in range(4)]
        times = []
        for i in range(WARM + STEPS):
            x, y = hosts[i % 4]
            t = time.perf_counter()
            p, loss = step_fn(p, jax.device_put(x), jax.device_put(y), i)
            float(loss)
            if i >= WARM:
                times.append(time.perf_counter() - t)
        report("jax", "jit", model, n, times)


if __name__ == "__main__":
    which = sys.argv[1:] or ["torch", "jax"]
    if "torch" in which:
        torch_anchors()
    if "jax" in which:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        jax_anchors()
