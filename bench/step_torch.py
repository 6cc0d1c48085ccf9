"""step_torch.py - the peer for bench_step: one training step (forward, loss,
backward, Adam update) of the seed MLP 784 -> 4096 -> 4096 -> 10 at batch
1024 in PyTorch, float32 and with bfloat16 autocast, with the thread count given
(default 2; bench_step passes its own). Prints
`torch_f32_ms=X torch_bf16_ms=Y torch_version=V torch_f32_cpu_ms=A
torch_bf16_cpu_ms=B` (medians after warm-up of wall time and of the
process's CPU time, all threads, per step). A step slower than 5 s (bf16
autocast on a CPU without AVX512_BF16 is emulated: about 46 s on an AMD
EPYC Zen 3) is measured 3 times after one warm-up, so the benchmark ends."""
import statistics
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
torch.manual_seed(0)
B = 1024
x = torch.rand(B, 784)
y = torch.randint(0, 10, (B,))


def median_step_ms(autocast, reps=10, warmup=3):
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    times, cpu = [], []
    i = 0
    while i < warmup + reps:
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        loss = loss_fn(out.float(), y)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
        elif time.perf_counter() - t0 > 5.0:
            warmup, reps = i + 1, 3
        i += 1
    return statistics.median(times), statistics.median(cpu)


f32, bf16 = median_step_ms(False), median_step_ms(True)
print(f"torch_f32_ms={f32[0]:.2f} torch_bf16_ms={bf16[0]:.2f} torch_version={torch.__version__} "
      f"torch_f32_cpu_ms={f32[1]:.2f} torch_bf16_cpu_ms={bf16[1]:.2f}")
