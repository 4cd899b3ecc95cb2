"""The simulated node: a fake `vllm serve` (API server, EngineCores, /metrics, Ray executor) and GPUs coupled to it.

Not part of the agent: the agent reaches it only through `agent/gpu/backend.py` (the `fake_nvml = "sim"` seam), and
it imports only the GPU backend protocol and the contract. Everything it shows a user is labelled simulated.
"""
