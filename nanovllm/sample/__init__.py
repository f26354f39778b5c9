"""Token sampling, one concept per file: the step's sampling metadata (`metadata`), the sampler
(`sampler`), penalties (`penalties`), truncation by min-p, top-k and top-p (`truncation`) and the
sampling noise with the seeds it comes from (`noise`). The Triton kernels stay in `kernels/`."""
