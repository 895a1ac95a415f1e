"""Arithmetic whose bits are the same on every x86-64 CPU with AVX2.

What the package promises: under the portable CPU kernels (`FEDSKEW_CPU_KERNELS=portable`, the
default), a run trained on one x86-64 CPU with AVX2 (Intel since 2013, AMD since 2015) gives the same
model, metrics and tables, bit for bit, on any other; `make verify` and the committed-results tests
check it. A run's id covers the recipe its model runs under (`cpu_pin.kernel_recipe`), so results of
an older recipe are retrained, never reused. GPUs, other architectures and `FEDSKEW_CPU_KERNELS=native`
are outside the promise (docs/reliability.md).

- `cpu_pin`: which CPU kernels compute. It sets the libraries' environment variables before torch or
  numpy is imported (`python -m fedskew` does so first): ATen at AVX2, MKL's `COMPATIBLE` branch,
  OpenBLAS at its Haswell kernels on one thread, no oneDNN or NNPACK for CPU training. Cost: about
  twice the native kernels' time for the CNNs (benchmarks/cpu_kernels.py); MKL's `COMPATIBLE` branch
  is SSE2 code, three times slower than AVX2, and keeps only the products nothing else reaches.
- `gemm`: the models' Linear and Conv2d products, forward and backward, through numpy's OpenBLAS
  (recipe 2). Cost: none over AVX2 code (about three times faster than MKL's `COMPATIBLE`); one
  thread per product, so a bigger machine's speed comes from running runs side by side.
- `exact_math`: correctly rounded square roots (Adam, the FedOpt servers, FedDecorr, FL-FCR's
  sampling), where torch's vectorised sqrt is a unit in the last place off on some CPUs. Cost: one
  call into numpy on the tensor's own memory (no copy); not measured on its own.
- `sgd`, `adam`: local optimisers with torch's single-tensor arithmetic, bit-identical to
  `torch.optim` on CPU, without importing `torch._dynamo` (about 1.5 CPU-s a process).

Layers inside the package (pyproject.toml's import-linter contract "numerics"): adam above sgd, gemm
and exact_math, above cpu_pin. Nothing here imports the rest of fedskew, and this file imports
nothing, so `from fedskew.numerics import cpu_pin` stays free of torch and numpy.
"""
