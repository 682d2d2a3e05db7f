"""GPUs: discovery (NVML or simulated) and, per cell, binding the committed devices."""
